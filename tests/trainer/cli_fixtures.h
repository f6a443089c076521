// Running the real braid-train binary (path in $BRAID_TRAIN, set by meson)
// from the trainer tests, with its output captured in a temp directory.
#pragma once

#include <catch2/catch.hpp>
#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "model_fixtures.h"

namespace braid::trainer::test {

inline std::string read_text(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

struct Run {
  int rc = -1;
  std::string out, err;
};

// Runs `command` (a shell command line) with stdout and stderr to files in
// `dir`; rc is the exit status, -1 for a signal.
inline Run run_shell(const TempDir& dir, const std::string& command) {
  const std::string out = (dir / "stdout").string(), err = (dir / "stderr").string();
  const int status = std::system((command + " >" + out + " 2>" + err).c_str());
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, read_text(out), read_text(err)};
}

// Runs braid-train with `args` (no shell metacharacters needed).
inline Run braid_train(const TempDir& dir, const std::string& args) {
  const char* bin = std::getenv("BRAID_TRAIN");
  REQUIRE(bin != nullptr);
  return run_shell(dir, std::string(bin) + " " + args);
}

inline bool have_binary() {
  if (std::getenv("BRAID_TRAIN") != nullptr) return true;
  WARN("skipped: BRAID_TRAIN is not set (run through `meson test`)");
  return false;
}

// Text with some structure, so a few steps of training change the model.
inline std::filesystem::path write_text(const TempDir& dir, std::size_t bytes) {
  std::string text;
  Rng rng(5);
  const char* words[] = {"braid ", "ring ", "all-reduce ", "moves ", "bytes. ", "\n"};
  while (text.size() < bytes) text += words[rng.next_u64() % 6];
  text.resize(bytes);
  std::ofstream(dir / "text.txt", std::ios::binary) << text;
  return dir / "text.txt";
}

}  // namespace braid::trainer::test
