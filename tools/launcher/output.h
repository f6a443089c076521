// What braid-launch prints: its own messages, and the ranks' output relayed
// line by line with a "[rank r] " prefix.
//
// Each relayed line goes out in one write(2), so lines of different ranks
// never mix inside a line. Output to a closed stdout (`braid-launch ... |
// head`) is dropped rather than killing the launcher: the launcher ignores
// SIGPIPE and keeps supervising its ranks.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace braid::launcher {

// Writes all of text to fd, retrying short writes; gives up silently on
// errors such as EPIPE (there is nowhere left to report them).
void write_all(int fd, std::string_view text);

// Prints "braid-launch: <message>" as one line on stderr.
void say(const std::string& message);

// Splits one stream of one rank into lines and writes each, prefixed, to
// the destination descriptor.
class LineRelay {
 public:
  // Beyond this many bytes without a newline the pending text is written as
  // a line of its own, so a rank that never prints '\n' cannot grow the
  // launcher's memory without bound.
  static constexpr std::size_t kMaxLineBytes = 64u << 10;

  LineRelay(std::string prefix, int dest_fd);

  // Writes every complete line in the text; keeps the unterminated rest.
  void feed(std::string_view text);
  // Writes the unterminated rest, if any, with a newline added.
  void finish();

 private:
  void emit(std::string_view line);

  std::string prefix_;
  int dest_fd_;
  std::string pending_;
};

}  // namespace braid::launcher
