// braid-launch's stdin, forwarded to one rank (rank 0 unless --stdin says
// otherwise), as mpirun forwards it: `input()`, `breakpoint()` and pdb work
// on that rank, and `braid-launch ... < file` feeds it the file. Every
// other rank's stdin is /dev/null.
//
// The rank reads a pipe, never the terminal itself: ranks run in process
// groups of their own (process.h), which a terminal would stop with
// SIGTTIN for reading, and a pipe keeps one reader however many ranks
// there are. The launcher reads its stdin only while the pipe has room
// (backpressure, as for output) and, when stdin is a terminal, only while
// the launcher is in the terminal's foreground: `braid-launch ... &` in an
// interactive shell leaves the terminal to the shell, and starts reading
// once brought back with `fg`. SIGTTIN is ignored, so a read that races
// with being put in the background fails with EIO and is tried again,
// rather than stopping the launcher.
//
// End-of-file on stdin (Ctrl-D, the end of a file) closes the rank's pipe
// once what was read has been written into it. A rank that closes its
// stdin, or ends, drops what it did not read. After a restart
// (--max-restarts) the new attempt's rank gets a new pipe, and what was
// read but not yet written goes to it.
#pragma once

#include <chrono>
#include <cstddef>
#include <optional>
#include <string>

#include "tools/launcher/process.h"

namespace braid::launcher {

class InputRelay {
 public:
  using Clock = std::chrono::steady_clock;
  // Read but not yet written: past this the launcher stops reading stdin.
  static constexpr std::size_t kMaxPendingBytes = 64u << 10;
  // How often a launcher in the background of its terminal looks whether
  // it has been brought to the foreground.
  static constexpr std::chrono::milliseconds kForegroundRecheck{250};

  // source stays open and owned by the caller while the relay lives.
  explicit InputRelay(int source);
  InputRelay(const InputRelay&) = delete;
  InputRelay& operator=(const InputRelay&) = delete;

  // A new pipe for this attempt's reading rank: returns the end that
  // becomes its stdin, keeps the other. The previous attempt's pipe, if
  // any, is closed.
  UniqueFd connect();
  // Closes the rank's pipe: its attempt has ended.
  void disconnect() { target_.reset(); }

  // The descriptors to poll now, or -1: stdin for POLLIN while there is
  // room and somewhere to write it; the pipe for POLLOUT while bytes wait.
  int source_poll_fd() const;
  int target_poll_fd() const;
  // When to look again whether the launcher is back in its terminal's
  // foreground; none unless it is a terminal's background process.
  std::optional<Clock::time_point> recheck_deadline(Clock::time_point now) const;

  // One read of stdin (the caller polled it readable), written on at once.
  // Returns whether it read a line end from a terminal, whose echo has
  // moved the cursor to a new line (OutputSink::terminal_line_ended).
  bool read_source();
  // Writes what the pipe takes now.
  void write_target();

 private:
  bool in_background() const;
  void close_target_if_done();

  int source_;
  bool source_is_terminal_;
  bool source_ended_ = false;
  UniqueFd target_;
  std::string pending_;
};

}  // namespace braid::launcher
