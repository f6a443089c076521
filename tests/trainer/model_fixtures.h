// Small helpers shared by the trainer tests.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "trainer/data/text_data.h"
#include "trainer/model/gpt.h"
#include "trainer/model/rng.h"

namespace braid::trainer::test {

inline GptConfig tiny_config() { return GptConfig{2, 2, 8, 6, 256}; }

// Parameters far from the GPT-2 init, so every gradient path is exercised:
// normals of std 0.3, LayerNorm weights around 1, biases non-zero.
inline void randomize(Gpt& model, std::uint64_t seed) {
  Rng rng(seed);
  for (const ParamView& v : model.table().views()) {
    const bool ln_weight = v.name.find("ln_") != std::string::npos && v.name.find("weight") != std::string::npos;
    float* p = model.params().data() + v.offset;
    for (std::size_t i = 0; i < v.count(); ++i) {
      p[i] = static_cast<float>((ln_weight ? 1.0 : 0.0) + (ln_weight ? 0.1 : 0.3) * rng.normal());
    }
  }
}

inline std::vector<std::int32_t> random_tokens(std::size_t count, std::uint64_t seed) {
  Rng rng(seed);
  std::vector<std::int32_t> t(count);
  for (auto& x : t) x = static_cast<std::int32_t>(rng.next_u64() % 256);
  return t;
}

// 20 KB of words from a small vocabulary: enough structure that a few
// steps change the model, and no dependence on installed files.
inline TextCorpus synthetic_corpus() {
  TextCorpus c;
  c.source = "synthetic";
  Rng rng(99);
  const char* words[] = {"the ", "cat ", "sat ", "on ", "a ", "mat. ", "dogs ", "run\n"};
  while (c.bytes.size() < 20000) {
    for (char ch : std::string(words[rng.next_u64() % 8])) c.bytes.push_back(static_cast<std::uint8_t>(ch));
  }
  return c;
}

// A fresh directory under the system temp dir, removed on destruction.
class TempDir {
 public:
  TempDir() {
    static int counter = 0;
    path_ = std::filesystem::temp_directory_path() /
            ("braid_trainer_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::filesystem::path& path() const { return path_; }
  std::filesystem::path operator/(const std::string& name) const { return path_ / name; }

 private:
  std::filesystem::path path_;
};

}  // namespace braid::trainer::test
