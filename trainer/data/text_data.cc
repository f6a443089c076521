#include "trainer/data/text_data.h"

#include <algorithm>
#include <cerrno>
#include <fstream>
#include <iterator>
#include <string_view>

#include "runtime/errors.h"
#include "trainer/model/rng.h"

namespace braid::trainer {

namespace fs = std::filesystem;

std::uint64_t TextCorpus::fingerprint() const {
  return fnv1a(std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()));
}

namespace {

void append_file(const fs::path& path, std::vector<std::uint8_t>& out) {
  errno = 0;
  std::ifstream in(path, std::ios::binary);
  // With the reason (Permission denied): it was left out (a review helper's case).
  if (!in)
    throw InvalidUsage(errno_message("cannot open data file " + path.string() + " for reading", errno) +
                       "; check --data");
  out.insert(out.end(), std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  if (in.bad()) throw SystemError("reading data file " + path.string() + " failed");
}

}  // namespace

TextCorpus load_text_file(const fs::path& path) {
  std::error_code ec;
  // A link loop or a directory that cannot be searched is no missing file.
  if (!fs::exists(path, ec) && ec && ec != std::errc::no_such_file_or_directory)
    throw InvalidUsage("data file " + path.string() + " cannot be reached: " + ec.message() + "; check --data");
  if (!fs::exists(path, ec)) throw InvalidUsage("data file " + path.string() + " does not exist; check --data");
  if (!fs::is_regular_file(path, ec)) {
    throw InvalidUsage("data file " + path.string() + " is not a regular file; pass a text file to --data");
  }
  TextCorpus corpus{{}, path.string()};
  append_file(path, corpus.bytes);
  if (corpus.bytes.empty()) throw InvalidUsage("data file " + path.string() + " is empty; pass a text file with content");
  return corpus;
}

TextCorpus load_default_corpus(const fs::path& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    throw InvalidUsage("the default corpus " + dir.string() +
                       " is missing; install Debian's `fortunes` package or pass --data FILE");
  }
  std::vector<fs::path> files;
  for (const auto& entry : fs::directory_iterator(dir)) {
    // is_regular_file follows links: the *.u8 links are excluded by having an extension.
    if (entry.is_regular_file() && !entry.path().has_extension()) files.push_back(entry.path());
  }
  std::sort(files.begin(), files.end());
  TextCorpus corpus{{}, dir.string()};
  for (const auto& f : files) append_file(f, corpus.bytes);
  if (corpus.bytes.empty()) {
    throw InvalidUsage("the default corpus " + dir.string() + " holds no text files; pass --data FILE");
  }
  return corpus;
}

Split split(const TextCorpus& corpus, double val_fraction) {
  const std::size_t n = corpus.bytes.size();
  const auto val = static_cast<std::size_t>(static_cast<double>(n) * val_fraction);
  std::span<const std::uint8_t> all(corpus.bytes);
  return Split{all.first(n - val), all.last(val)};
}

BatchSampler::BatchSampler(std::span<const std::uint8_t> bytes, int T, std::uint64_t seed, SampleStream stream)
    : bytes_(bytes), T_(T), seed_(seed), stream_(stream) {
  if (T < 1 || bytes.size() < static_cast<std::size_t>(T) + 1) {
    throw InvalidUsage("a split of " + std::to_string(bytes.size()) + " bytes cannot hold one window of block_size " +
                       std::to_string(T) + " + 1 bytes; lower --block-size or use more data");
  }
}

std::size_t BatchSampler::offset(std::int64_t step, std::int64_t index) const {
  const std::uint64_t h = hash_words({seed_, static_cast<std::uint64_t>(stream_), static_cast<std::uint64_t>(step),
                                      static_cast<std::uint64_t>(index)});
  return static_cast<std::size_t>(h % (bytes_.size() - static_cast<std::size_t>(T_)));
}

void BatchSampler::fill(std::int64_t step, std::int64_t first_index, int B, std::int32_t* inputs,
                        std::int32_t* targets) const {
  for (int b = 0; b < B; ++b) {
    const std::uint8_t* window = bytes_.data() + offset(step, first_index + b);
    for (int t = 0; t < T_; ++t) {
      inputs[b * T_ + t] = window[t];
      targets[b * T_ + t] = window[t + 1];
    }
  }
}

}  // namespace braid::trainer
