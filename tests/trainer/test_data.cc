// The byte corpus and the sampler: batches are a function of
// (seed, step, global index), the default corpus is the sorted plain fortune
// files, and bad data files are refused clearly.
#include <catch2/catch.hpp>

#include <fstream>

#include "model_fixtures.h"
#include "runtime/errors.h"
#include "trainer/data/text_data.h"

namespace braid::trainer {
namespace {

namespace fs = std::filesystem;

void write(const fs::path& path, const std::string& text) { std::ofstream(path, std::ios::binary) << text; }

TextCorpus counting_corpus(std::size_t bytes) {
  TextCorpus c;
  for (std::size_t i = 0; i < bytes; ++i) c.bytes.push_back(static_cast<std::uint8_t>(i * 31 % 251));
  return c;
}

TEST_CASE("a sample is a function of (seed, step, global index)", "[data]") {
  const TextCorpus corpus = counting_corpus(5000);
  const int T = 16;
  BatchSampler a(corpus.bytes, T, 7, SampleStream::kTrain), b(corpus.bytes, T, 7, SampleStream::kTrain);
  BatchSampler other_seed(corpus.bytes, T, 8, SampleStream::kTrain), val(corpus.bytes, T, 7, SampleStream::kVal);
  int differ_step = 0, differ_seed = 0, differ_stream = 0;
  for (std::int64_t step = 0; step < 20; ++step) {
    for (std::int64_t i = 0; i < 8; ++i) {
      REQUIRE(a.offset(step, i) == b.offset(step, i));
      REQUIRE(a.offset(step, i) + T + 1 <= corpus.bytes.size());
      differ_step += a.offset(step, i) != a.offset(step + 1, i);
      differ_seed += a.offset(step, i) != other_seed.offset(step, i);
      differ_stream += a.offset(step, i) != val.offset(step, i);
    }
  }
  CHECK(differ_step > 150);
  CHECK(differ_seed > 150);
  CHECK(differ_stream > 150);

  // Any rank can fill any slice of a global batch: samples 4..7 alone equal
  // the second half of the whole batch.
  std::vector<std::int32_t> in(8 * T), tg(8 * T), in_half(4 * T), tg_half(4 * T);
  a.fill(3, 0, 8, in.data(), tg.data());
  b.fill(3, 4, 4, in_half.data(), tg_half.data());
  CHECK(std::equal(in_half.begin(), in_half.end(), in.begin() + 4 * T));
  CHECK(std::equal(tg_half.begin(), tg_half.end(), tg.begin() + 4 * T));
  const std::size_t o = a.offset(3, 5);
  CHECK(in[5 * T] == corpus.bytes[o]);
  CHECK(tg[5 * T + T - 1] == corpus.bytes[o + T]);
}

TEST_CASE("the split keeps the last 10% for validation", "[data]") {
  const TextCorpus corpus = counting_corpus(1000);
  const Split s = split(corpus);
  CHECK(s.train.size() == 900);
  CHECK(s.val.size() == 100);
  CHECK(s.val.data() == corpus.bytes.data() + 900);
  CHECK_THROWS_AS(BatchSampler(s.val, 100, 1, SampleStream::kVal), InvalidUsage);
  CHECK_NOTHROW(BatchSampler(s.val, 99, 1, SampleStream::kVal));
}

TEST_CASE("the default corpus is the plain files in sorted order", "[data]") {
  test::TempDir dir;
  write(dir / "zeta", "Z");
  write(dir / "alpha", "A");
  write(dir / "alpha.dat", "index");
  fs::create_symlink("alpha", dir / "alpha.u8");
  fs::create_directory(dir / "off");
  write(dir / "off" / "beta", "nested");
  const TextCorpus c = load_default_corpus(dir.path());
  CHECK(std::string(c.bytes.begin(), c.bytes.end()) == "AZ");

  if (!fs::is_directory(kDefaultCorpusDir)) {
    WARN("skipped the real corpus: " << kDefaultCorpusDir << " is missing (install Debian's fortunes)");
    return;
  }
  const TextCorpus real = load_default_corpus();
  CHECK(real.bytes.size() > 100000);
  std::ifstream art(std::string(kDefaultCorpusDir) + "/art", std::ios::binary);
  std::string first(64, '\0');
  art.read(first.data(), 64);
  CHECK(std::string(real.bytes.begin(), real.bytes.begin() + 64) == first);
}

TEST_CASE("missing, empty and non-regular data files are refused clearly", "[data]") {
  test::TempDir dir;
  write(dir / "empty", "");
  auto message = [](const fs::path& p) {
    try {
      load_text_file(p);
    } catch (const InvalidUsage& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  CHECK_THAT(message(dir / "nope"), Catch::Contains("does not exist") && Catch::Contains("nope"));
  CHECK_THAT(message(dir / "empty"), Catch::Contains("is empty"));
  CHECK_THAT(message(dir.path()), Catch::Contains("not a regular file"));
  CHECK_THROWS_AS(load_default_corpus(dir / "nope"), InvalidUsage);
  // A link loop was "does not exist" (a review helper's case).
  fs::create_symlink("loop", dir / "loop");
  CHECK_THAT(message(dir / "loop"),
             Catch::Contains("cannot be reached: Too many levels of symbolic links") && !Catch::Contains("does not exist"));
  write(dir / "text", "hello");
  CHECK(load_text_file(dir / "text").bytes.size() == 5);
}

}  // namespace
}  // namespace braid::trainer
