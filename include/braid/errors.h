// braid's one error hierarchy (DESIGN.md, STYLE.md "Errors").
//
// Every failure that crosses a public API is one of these five exceptions.
// Messages are complete sentences that say what happened, on which rank,
// with which peer, and what to do about it; callers should be able to print
// e.what() and nothing else.
#pragma once

#include <stdexcept>
#include <string>

namespace braid {

// Base of every braid exception.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A system call or library call failed on this rank (errno-style cause).
class SystemError : public Error {
 public:
  using Error::Error;
};

// A peer died, closed its connection, or sent something this rank did not
// expect (wrong collective, wrong size, bad header, wrong token).
class RemoteError : public Error {
 public:
  explicit RemoteError(const std::string& what, int peer = -1) : Error(what), peer_(peer) {}
  // The peer rank at fault, -1 when unknown.
  int peer() const { return peer_; }

 private:
  int peer_;
};

// The caller asked for something invalid: bad arguments, bad configuration.
// Thrown before any byte moves.
class InvalidUsage : public Error {
 public:
  using Error::Error;
};

// A wait ran past its deadline.
class TimeoutError : public Error {
 public:
  using Error::Error;
};

// The operation was cancelled because its communicator had already failed,
// or was aborted (Communicator::abort) before or while it ran.
class AbortedError : public Error {
 public:
  using Error::Error;
};

// "<what>: <strerror(err)>"
std::string errno_message(const std::string& what, int err);

}  // namespace braid
