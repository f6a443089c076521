// Byte-level text: the corpus, its train/val split, and the batch sampler.
//
// Every byte is a token (vocabulary 256). The default corpus is the
// plain-text fortune files of Debian's `fortunes` package: the files in
// /usr/share/games/fortunes without an extension (the *.dat indexes and the
// *.u8 links are skipped), in sorted name order, concatenated.
//
// Sampling is a pure function, never a stateful stream: sample `index` of
// the GLOBAL batch of step `step` is the window of T+1 bytes at
//   offset = hash_words({seed, stream, step, index}) mod (bytes - T)
// (hash_words in trainer/model/rng.h), inputs the first T bytes, targets
// the last T. So any data-parallel rank computes any sample of any step, a
// resumed run needs only the step, and the modulo bias (< bytes / 2^64) is
// negligible.
#pragma once

#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

namespace braid::trainer {

inline constexpr const char* kDefaultCorpusDir = "/usr/share/games/fortunes";

struct TextCorpus {
  std::vector<std::uint8_t> bytes;
  std::string source;  // file or directory it came from, for messages
  std::uint64_t fingerprint() const;  // FNV-1a of the bytes
};

// Throws InvalidUsage naming the file when it is missing, not a regular
// file, unreadable or empty.
TextCorpus load_text_file(const std::filesystem::path& path);
TextCorpus load_default_corpus(const std::filesystem::path& dir = kDefaultCorpusDir);

// The last `val_fraction` of the bytes is the validation split.
struct Split {
  std::span<const std::uint8_t> train;
  std::span<const std::uint8_t> val;
};
inline constexpr double kValFraction = 0.1;
Split split(const TextCorpus& corpus, double val_fraction = kValFraction);

// Streams keep train batches and the fixed validation batches apart.
enum class SampleStream : std::uint64_t { kTrain = 1, kVal = 2, kTrainEval = 3 };

class BatchSampler {
 public:
  // Throws InvalidUsage when `bytes` holds fewer than T + 1 bytes.
  BatchSampler(std::span<const std::uint8_t> bytes, int T, std::uint64_t seed, SampleStream stream);

  std::size_t offset(std::int64_t step, std::int64_t index) const;
  // Samples [first_index, first_index + B) of `step`: inputs and targets [B, T].
  void fill(std::int64_t step, std::int64_t first_index, int B, std::int32_t* inputs,
            std::int32_t* targets) const;
  int T() const { return T_; }

 private:
  std::span<const std::uint8_t> bytes_;
  int T_;
  std::uint64_t seed_;
  SampleStream stream_;
};

}  // namespace braid::trainer
