// The store's client side. Each Store owns a private io_context that only the
// calling thread drives, and only through run_one_until(deadline): every
// connect, write and read is bounded, and a deadline that passes closes the
// socket, which cancels the operation. A request that the store did not
// answer in time closes the connection (its answer may still come), and the
// next request opens a new one: the store may only have been starved of
// CPU, and communicators split from one parent share its connection. The
// new connection must reach the same store (its instance, drawn when it
// started, is checked): one restarted on the same port has lost every key.
// A request that failed otherwise in transport leaves the connection
// marked broken, and later requests fail at once with the first cause.

// Boost 1.74's asio/awaitable.hpp uses std::exchange without including
// <utility>; GCC 12 in C++20 mode needs it included first.
#include <utility>

#include <sys/resource.h>

#include <boost/asio.hpp>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <optional>
#include <set>
#include <thread>

#include "runtime/config.h"
#include "runtime/errors.h"
#include "runtime/store.h"
#include "runtime/store_wire.h"

namespace braid::runtime {
namespace {

namespace asio = boost::asio;
using asio::ip::tcp;
using boost::system::error_code;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;
using namespace store_wire;

// Added to a get or wait's own timeout, for the server's answer to arrive.
constexpr milliseconds kAnswerMargin{1000};
// A get or wait asks the server in slices, handing the connection to the
// requests queued behind it between slices: of 200 ms while another thread
// has used the connection in the last 2 s (threads that wait for each
// other's keys, splits of sibling communicators, or heartbeats that must
// not stall), else doubling up to 2 s, so that a rank waiting alone for a
// slow peer asks about once every 2 s.
constexpr milliseconds kFirstWaitSlice{200};
constexpr milliseconds kLongestWaitSlice{2000};
constexpr milliseconds kConnectRetry{25};
// Store::find: how long one port may take to answer the handshake, how soon
// a port that refused us or did not answer is tried again, and when a search
// that has not succeeded says so.
constexpr milliseconds kProbeAnswer{2000};
constexpr milliseconds kProbeRetry{1000};
constexpr milliseconds kProbeWarning{5000};

// Out of file descriptors is this process's own limit, not a store that is
// not up yet: retried like one, it left a process that opens many
// communicators (torch's new_group) waiting for the whole timeout, 30 min
// under torch, with a warning at most.
void fail_if_out_of_descriptors(const error_code& ec, const std::string& where) {
  if (ec != asio::error::no_descriptors && ec != boost::system::errc::too_many_files_open_in_system) return;
  rlimit nofile{};
  const std::string limit = getrlimit(RLIMIT_NOFILE, &nofile) == 0 && nofile.rlim_cur != RLIM_INFINITY
                                ? " of its " + std::to_string(nofile.rlim_cur)
                                : std::string();
  throw SystemError("cannot open a socket to reach the store at " + where + ": " + ec.message() +
                    " (this process holds all" + limit + " descriptors it may open, ulimit -n): raise the limit, "
                    "or create fewer communicators or process groups (each takes descriptors for its peers)");
}

// What greeting a store on one port found.
// A port not reached (no route, unreachable) is not one where nothing
// listens, nor one the time ran out before (found by a review helper: both
// read "nothing listens").
enum class Probe {
  not_tried,
  accepted,
  nothing_listening,
  unreachable,
  hung_up,
  no_answer,
  io_error,
  wrong_token,
  refused,
  not_a_store
};

struct ProbeResult {
  Probe kind = Probe::not_tried;
  std::string detail;
  error_code ec;
  std::uint64_t instance = 0;  // accepted: the store's (store_wire.h)
};

// How a port's answer reads in an error message.
std::string describe(const ProbeResult& result) {
  switch (result.kind) {
    case Probe::not_tried: return "not tried before the time ran out";
    case Probe::accepted: return "accepted";
    case Probe::nothing_listening: return "nothing listens (" + result.detail + ")";
    case Probe::unreachable: return "not reached (" + result.detail + ")";
    case Probe::hung_up: return "closed the connection before answering";
    case Probe::no_answer: return "no answer within " + result.detail + " ms";
    case Probe::wrong_token:
    case Probe::refused: return result.detail;
    case Probe::io_error: return "failed: " + result.detail;
    case Probe::not_a_store: return "not a braid store (" + result.detail + ")";
  }
  return result.detail;
}

// "nothing listens (...) at 21034, 27211; store refused connection: ... at 29500",
// ports grouped by what they said, in the order first seen.
std::string summarize(const std::vector<std::uint16_t>& ports, const std::vector<ProbeResult>& said) {
  std::vector<std::pair<std::string, std::string>> groups;
  for (std::size_t i = 0; i < ports.size(); ++i) {
    std::string text = describe(said[i]);
    auto group = std::find_if(groups.begin(), groups.end(), [&](const auto& g) { return g.first == text; });
    if (group == groups.end()) group = groups.insert(groups.end(), {text, ""});
    group->second += (group->second.empty() ? "" : ", ") + std::to_string(ports[i]);
  }
  std::string out;
  for (const auto& [text, where] : groups) out += (out.empty() ? "" : "; ") + text + " at " + where;
  return out;
}

struct Reply {
  Status status;
  Bytes body;
  bool answered = true;  // false: a slice of a wait the store did not answer in time (Store::Impl::call)
};

// One exchange with the server: its deadline, and what it was doing, for
// the error message if it fails ("while setting key 'x'"). `slice`: one
// slice of a get or wait.
struct Exchange {
  Exchange(milliseconds bound, std::string doing, bool slice = false)
      : timeout(bound), deadline(Clock::now() + bound), what(std::move(doing)), slice(slice) {}
  milliseconds timeout;
  Clock::time_point deadline;
  std::string what;
  bool slice;
};

// Thrown by Store::Impl::fail for a slice the store did not answer in
// time; Store::Impl::call turns it into an unanswered Reply.
struct LateAnswer {};

std::uint32_t wire_ms(milliseconds timeout) {
  return static_cast<std::uint32_t>(std::clamp<std::int64_t>(timeout.count(), 0, UINT32_MAX));
}

std::string ms_text(milliseconds duration) { return std::to_string(duration.count()) + " ms"; }

// A set's body: the key, then the value's bytes.
template <class Value>
Bytes set_body(const std::string& key, const Value& value) {
  Bytes body;
  put_key(body, key);
  body.insert(body.end(), value.begin(), value.end());
  return body;
}

bool is_hang_up(const error_code& ec) {
  return ec == asio::error::eof || ec == asio::error::connection_reset ||
         ec == asio::error::broken_pipe || ec == asio::error::connection_aborted;
}

// How long the next slice of a wait until `deadline` asks the server to
// wait, after `previous` (zero for the first); `shared`: another thread uses
// the connection too.
milliseconds next_slice(Clock::time_point deadline, milliseconds previous, bool shared) {
  const auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now());
  const milliseconds slice =
      previous.count() == 0 || shared ? kFirstWaitSlice : std::min(previous * 2, kLongestWaitSlice);
  return std::clamp(left, milliseconds(0), slice);
}

// The connection's lock, granted in the order asked for. Communicators
// split from one parent share its connection, and a thread waiting there
// for a peer's key held it for the whole wait, up to BRAID_TIMEOUT: two
// threads splitting sibling communicators at once each waited for a key
// that the peer's other thread could not set, queued behind its own
// sibling's wait (a deadlock across processes until the timeout). Waits now
// go in slices (kFirstWaitSlice), and between slices every request queued
// meanwhile goes first, which a plain mutex, free to hand the lock straight
// back to the waiting thread, does not promise.
class TurnLock {
 public:
  void lock() { take(std::nullopt); }
  bool try_lock_until(Clock::time_point deadline) { return take(deadline); }
  void unlock() {
    std::lock_guard guard(mu_);
    ++serving_;
    while (abandoned_.erase(serving_) != 0) ++serving_;
    turn_.notify_all();
  }

 private:
  bool take(std::optional<Clock::time_point> deadline) {
    std::unique_lock guard(mu_);
    const std::uint64_t ticket = next_++;
    auto mine = [&] { return serving_ == ticket; };
    if (!deadline) {
      turn_.wait(guard, mine);
      return true;
    }
    if (turn_.wait_until(guard, *deadline, mine)) return true;
    abandoned_.insert(ticket);  // a later turn: unlock() passes over it
    return false;
  }

  std::mutex mu_;
  std::condition_variable turn_;
  std::uint64_t next_ = 0;     // the next ticket handed out
  std::uint64_t serving_ = 0;  // the ticket that holds the lock
  std::set<std::uint64_t> abandoned_;
};

}  // namespace

struct Store::Impl {
  // Connects to host:port and nowhere else (Store's constructor).
  Impl(std::string host, std::uint16_t port, std::string token, milliseconds connect_timeout);
  // Not connected yet: find() connects.
  Impl(std::string host, std::string token, milliseconds request_timeout);
  // One attempt on `port` (Store::takes_token).
  bool takes_token(std::uint16_t port, milliseconds timeout) {
    return attempt(port, Clock::now() + timeout).kind == Probe::accepted;
  }
  void find(const std::vector<std::uint16_t>& ports, milliseconds timeout, const std::string& remedy);
  std::uint16_t port() const { return port_; }

  // Sends one request and reads its answer, holding the mutex throughout.
  // Bounded by the request timeout, or for a get or wait by its own `wait`
  // plus kAnswerMargin; with `bound`, by that too, the wait for the mutex
  // included. Returns replies with status ok, not_found or timeout; throws
  // for everything else.
  Reply call(Command command, const Bytes& body, const std::string& what,
             std::optional<milliseconds> wait = std::nullopt, std::optional<Clock::time_point> bound = std::nullopt);
  void set_request_timeout(milliseconds timeout);
  // A get or wait of `timeout` whose last slice the store did not answer.
  TimeoutError unanswered(milliseconds timeout, const std::string& what) const {
    return TimeoutError("store at " + where() + " did not answer within " + ms_text(timeout) + " " + what +
                        " (its last request went unanswered; the process serving it may be stopped, or starved "
                        "of CPU)");
  }
  milliseconds request_timeout() const { return request_timeout_.load(std::memory_order_relaxed); }
  std::string where() const { return host_ + ":" + std::to_string(port_); }
  // The connection a late answer closed (fail), opened again within the
  // exchange's time; false where the store did not answer that in time.
  bool reopen(const Exchange& exchange);
  // Whether a thread other than this one made a request in the last
  // kLongestWaitSlice (next_slice).
  bool shared_lately() const {
    return last_caller_.load(std::memory_order_relaxed) != std::this_thread::get_id() ||
           Clock::now() - other_called_at_.load(std::memory_order_relaxed) < kLongestWaitSlice;
  }

 private:
  template <class Start>
  error_code run_until(Start start, Clock::time_point deadline);
  void connect(Clock::time_point deadline, milliseconds connect_timeout);
  bool try_connect(Clock::time_point deadline, error_code& last);
  // False when the server hung up before answering.
  bool handshake();
  // Sends the handshake and reads the answer; never throws.
  ProbeResult greet(Clock::time_point deadline);
  // One connection and handshake on `port`, closed again unless accepted.
  ProbeResult attempt(std::uint16_t port, Clock::time_point deadline);
  [[noreturn]] void not_found(const std::vector<std::uint16_t>& ports, const std::vector<ProbeResult>& said,
                              milliseconds timeout, const std::string& remedy);
  void write_all(const Bytes& bytes, const Exchange& exchange);
  Bytes read_exact(std::size_t bytes, const Exchange& exchange);
  [[noreturn]] void fail(const error_code& ec, const Exchange& exchange);
  [[noreturn]] void fail_with(const std::string& why, const Exchange& exchange);
  // reopen reached a store other than the one this connection had.
  [[noreturn]] void replaced(const Exchange& exchange);

  std::string host_;
  std::uint16_t port_;
  std::string token_;
  TurnLock mutex_;  // held for a whole request (call), granted in turn
  std::atomic<milliseconds> request_timeout_;
  asio::io_context io_{1};
  tcp::socket socket_{io_};
  std::string broken_;  // why the connection is unusable; empty while it is fine
  // A slice of a wait went unanswered past its margin (the store's thread
  // starved of CPU for a second, say): the connection was closed, since its
  // answer may still come, and the next request opens another (reopen).
  // Breaking it for good turned a stall of a second into the failure of a
  // wait that had minutes left.
  bool reopen_ = false;
  // The store's instance as its first handshake gave it (store_wire.h):
  // reopen checks that it reaches the same store.
  std::uint64_t instance_ = 0;
  // The thread of the latest request, and when a thread other than the one
  // before it last made one (shared_lately).
  std::atomic<std::thread::id> last_caller_{};
  std::atomic<Clock::time_point> other_called_at_{};
};

Store::Impl::Impl(std::string host, std::uint16_t port, std::string token, milliseconds connect_timeout)
    : host_(std::move(host)), port_(port), token_(std::move(token)), request_timeout_(connect_timeout) {
  // Until told otherwise (set_request_timeout) every request, the handshake
  // first, is bounded by the same timeout the caller gave for connecting.
  auto deadline = Clock::now() + connect_timeout;
  connect(deadline, connect_timeout);
  while (!handshake()) {
    // A flooded server drops the oldest connections waiting for their
    // handshake; ours was one of them, so try again (store_server.h).
    if (Clock::now() + kConnectRetry >= deadline)
      throw RemoteError("the store at " + where() + " closed every connection before answering the " +
                        "handshake for " + ms_text(connect_timeout) +
                        "; it may be flooded with connections (see its log)");
    std::this_thread::sleep_for(kConnectRetry);
    connect(deadline, connect_timeout);
  }
}

Store::Impl::Impl(std::string host, std::string token, milliseconds request_timeout)
    : host_(std::move(host)), port_(0), token_(std::move(token)), request_timeout_(request_timeout) {}

// Round after round over the ports, each port on its own schedule (store.h).
void Store::Impl::find(const std::vector<std::uint16_t>& ports, milliseconds timeout, const std::string& remedy) {
  if (ports.empty()) throw InvalidUsage("no port to look for the store on " + host_);
  const auto start = Clock::now();
  const auto deadline = start + timeout;
  std::vector<ProbeResult> said(ports.size());
  std::vector<Clock::time_point> next(ports.size(), start);
  bool warned = false;
  while (Clock::now() < deadline) {
    for (std::size_t i = 0; i < ports.size() && Clock::now() < deadline; ++i) {
      if (next[i] > Clock::now()) continue;
      said[i] = attempt(ports[i], std::min(deadline, Clock::now() + kProbeAnswer));
      if (said[i].kind == Probe::accepted) return;
      bool soon = said[i].kind == Probe::nothing_listening || said[i].kind == Probe::unreachable ||
                  said[i].kind == Probe::hung_up;
      next[i] = Clock::now() + (soon ? kConnectRetry : kProbeRetry);
    }
    if (!warned && Clock::now() - start >= kProbeWarning) {
      warned = true;
      spdlog::warn("store: no store of this job answered on {} yet, still trying for {} ms: {}", host_,
                   timeout.count(), summarize(ports, said));
    }
    std::this_thread::sleep_until(std::min(*std::min_element(next.begin(), next.end()), deadline));
  }
  not_found(ports, said, timeout, remedy);
}

void Store::Impl::not_found(const std::vector<std::uint16_t>& ports, const std::vector<ProbeResult>& said,
                            milliseconds timeout, const std::string& remedy) {
  std::string text = "no store of this job answered on " + host_ + " within " + ms_text(timeout) +
                     " at any of its ports: " + summarize(ports, said) + (remedy.empty() ? "" : "; " + remedy);
  bool refused = std::any_of(said.begin(), said.end(), [](const ProbeResult& r) {
    return r.kind == Probe::wrong_token || r.kind == Probe::refused;
  });
  if (refused) throw RemoteError(text);
  throw TimeoutError(text);
}

ProbeResult Store::Impl::attempt(std::uint16_t port, Clock::time_point deadline) {
  port_ = port;
  // The probe's own bound, which a search's deadline may cut below
  // kProbeAnswer: "no answer within 2000 ms" of a 500 ms search misled.
  const std::string waited =
      std::to_string(std::max<std::int64_t>(0, std::chrono::ceil<milliseconds>(deadline - Clock::now()).count()));
  error_code ec;
  if (!try_connect(deadline, ec)) {
    if (ec == asio::error::timed_out) return {Probe::no_answer, waited, ec};
    if (ec == asio::error::connection_refused) return {Probe::nothing_listening, ec.message(), ec};
    return {Probe::unreachable, ec.message(), ec};
  }
  socket_.set_option(tcp::no_delay(true), ec);
  ProbeResult result = greet(deadline);
  if (result.kind == Probe::no_answer) result.detail = waited;
  if (result.kind == Probe::accepted) instance_ = result.instance;
  if (result.kind != Probe::accepted) {
    error_code ignored;
    socket_.close(ignored);
  }
  return result;
}

// Runs one asynchronous operation to completion or until the deadline; on
// the deadline, closing the socket makes the operation finish (aborted), and
// timed_out is returned.
template <class Start>
error_code Store::Impl::run_until(Start start, Clock::time_point deadline) {
  std::optional<error_code> result;
  io_.restart();
  start([&result](error_code ec, auto&&...) { result = ec; });
  while (!result && Clock::now() < deadline) io_.run_one_until(deadline);
  if (!result) io_.poll();  // an operation that completed right at the deadline still counts
  if (result) return *result;
  error_code ignored;
  socket_.close(ignored);
  io_.restart();
  io_.run();
  return asio::error::timed_out;
}

// The server may start after its clients, so a failed connection is retried
// every kConnectRetry until connect_timeout has passed. A host name is
// resolved by the system resolver, whose own timeouts bound that step.
void Store::Impl::connect(Clock::time_point deadline, milliseconds connect_timeout) {
  error_code last;
  while (!try_connect(deadline, last)) {
    auto now = Clock::now();
    if (now >= deadline)
      throw TimeoutError("no store answered at " + where() + " within " + ms_text(connect_timeout) +
                         " (last error: " + (last == asio::error::timed_out ? "no answer" : last.message()) +
                         "); is the launcher or rank 0 running and serving the store?");
    std::this_thread::sleep_until(std::min(now + kConnectRetry, deadline));
  }
  error_code ignored;
  socket_.set_option(tcp::no_delay(true), ignored);
}

bool Store::Impl::try_connect(Clock::time_point deadline, error_code& last) {
  tcp::resolver resolver(io_);
  auto endpoints = resolver.resolve(host_, std::to_string(port_), last);
  for (const auto& entry : endpoints) {
    last = run_until([&](auto handler) { socket_.async_connect(entry.endpoint(), handler); }, deadline);
    if (!last) return true;
    fail_if_out_of_descriptors(last, where());
    error_code ignored;
    socket_.close(ignored);
  }
  return false;
}

bool Store::Impl::handshake() {
  Exchange exchange(request_timeout(), "during the handshake");
  ProbeResult hello = greet(exchange.deadline);
  switch (hello.kind) {
    case Probe::accepted: instance_ = hello.instance; return true;
    case Probe::hung_up: return false;
    case Probe::wrong_token:
    case Probe::refused: throw RemoteError(hello.detail + " (store at " + where() + ")");
    case Probe::not_a_store: fail_with(hello.detail, exchange);
    default: fail(hello.ec, exchange);
  }
}

ProbeResult Store::Impl::greet(Clock::time_point deadline) {
  Bytes hello(kMagic, kMagic + sizeof kMagic);
  put_u32(hello, kStoreProtocolVersion);
  put_u32(hello, static_cast<std::uint32_t>(token_.size()));
  put_text(hello, token_);
  Bytes header(kHandshakeReplyHeaderBytes);
  error_code ec = run_until(
      [&](auto handler) { asio::async_write(socket_, asio::buffer(hello), handler); }, deadline);
  if (!ec) ec = run_until([&](auto handler) { asio::async_read(socket_, asio::buffer(header), handler); }, deadline);
  std::uint32_t message_bytes = ec ? 0 : load_u32(header.data() + 1);
  if (!ec && message_bytes > kMaxMessageBytes) return {Probe::not_a_store, "it sent a malformed handshake reply", ec};
  Bytes message(message_bytes);
  if (!ec) ec = run_until([&](auto handler) { asio::async_read(socket_, asio::buffer(message), handler); }, deadline);
  if (is_hang_up(ec)) {
    error_code ignored;
    socket_.close(ignored);
    return {Probe::hung_up, ec.message(), ec};
  }
  if (ec == asio::error::timed_out) return {Probe::no_answer, "", ec};
  if (ec) return {Probe::io_error, ec.message(), ec};
  std::string text(message.begin(), message.end());
  if (header[0] == kHandshakeOk && message.size() == kInstanceBytes)
    return {Probe::accepted, "", ec, WireReader(message).u64()};
  if (header[0] == kHandshakeOk) return {Probe::not_a_store, "it accepted with a malformed handshake reply", ec};
  return {header[0] == kHandshakeWrongToken ? Probe::wrong_token : Probe::refused, text, ec};
}

// A bounded call gives up waiting for the mutex at its bound, leaving the
// connection to the request that holds it; one whose bound has passed by the
// time it holds the mutex sends nothing, so that only a request the store
// has left unanswered closes the connection (and the next opens another).
Reply Store::Impl::call(Command command, const Bytes& body, const std::string& what,
                        std::optional<milliseconds> wait, std::optional<Clock::time_point> bound) {
  // A request the store refuses for its size closed the connection for
  // good, and one of 4 GiB or more would wrap the frame's length: refused
  // here, sending nothing (found by a review helper).
  if (body.size() > kMaxRequestBytes)
    throw InvalidUsage("a store request of " + std::to_string(body.size()) + " bytes (" + what +
                       ") is larger than any request may be (" + std::to_string(kMaxRequestBytes) +
                       " bytes, whatever BRAID_STORE_MAX_BYTES): store smaller values");
  const auto start = Clock::now();
  if (last_caller_.exchange(std::this_thread::get_id(), std::memory_order_relaxed) != std::this_thread::get_id())
    other_called_at_.store(start, std::memory_order_relaxed);
  std::unique_lock lock(mutex_, std::defer_lock);
  if (!bound) lock.lock();
  auto gave_up = [&] {
    return TimeoutError("store at " + where() + " did not answer within " +
                        ms_text(std::chrono::duration_cast<milliseconds>(*bound - start)) + " " + what +
                        ": this connection was still waiting for the answer to an earlier request");
  };
  if (bound && !lock.try_lock_until(*bound)) throw gave_up();
  if (!broken_.empty())
    throw RemoteError("the connection to the store at " + where() +
                      " is unusable after an earlier failure (" + broken_ + ")");
  milliseconds timeout = wait ? *wait + kAnswerMargin : request_timeout();
  if (bound) {
    const auto left = std::chrono::duration_cast<milliseconds>(*bound - Clock::now());
    if (left <= milliseconds(0)) throw gave_up();
    timeout = std::min(timeout, left);
  }
  Exchange exchange(timeout, what, wait.has_value());
  Reply reply{Status::timeout, {}};
  try {
    if (reopen_ && !reopen(exchange)) {
      // Nothing of this request went out: the next one tries again.
      if (exchange.slice) throw LateAnswer{};
      throw TimeoutError("store at " + where() + " did not answer within " + ms_text(exchange.timeout) + " " +
                         exchange.what + " (a new connection to it went unanswered)");
    }
    write_all(frame(std::uint8_t(command), body), exchange);
    Bytes header = read_exact(kFrameHeaderBytes, exchange);
    std::uint32_t body_bytes = load_u32(header.data());
    if (body_bytes > kMaxRequestBytes + kMaxMessageBytes) fail_with("it sent a malformed response", exchange);
    reply = Reply{Status(header[4]), read_exact(body_bytes, exchange)};
  } catch (const LateAnswer&) {
    return {Status::timeout, {}, false};
  }
  std::string text(reply.body.begin(), reply.body.end());
  switch (reply.status) {
    case Status::ok:
    case Status::not_found:
    case Status::timeout: return reply;
    case Status::bad_value: throw InvalidUsage(text + " (store at " + where() + ", " + exchange.what + ")");
    case Status::bad_request: fail_with("it rejected a request: " + text, exchange);
  }
  fail_with("it answered with unknown status " + std::to_string(static_cast<int>(reply.status)), exchange);
}

void Store::Impl::set_request_timeout(milliseconds timeout) {
  request_timeout_.store(timeout, std::memory_order_relaxed);
}

void Store::Impl::write_all(const Bytes& bytes, const Exchange& exchange) {
  error_code ec = run_until(
      [&](auto handler) { asio::async_write(socket_, asio::buffer(bytes), handler); }, exchange.deadline);
  if (ec) fail(ec, exchange);
}

Bytes Store::Impl::read_exact(std::size_t bytes, const Exchange& exchange) {
  Bytes out(bytes);
  error_code ec = run_until(
      [&](auto handler) { asio::async_read(socket_, asio::buffer(out), handler); }, exchange.deadline);
  if (ec) fail(ec, exchange);
  return out;
}

bool Store::Impl::reopen(const Exchange& exchange) {
  for (error_code last; Clock::now() < exchange.deadline;) {
    if (!try_connect(exchange.deadline, last)) {
      if (last == asio::error::connection_refused) fail(asio::error::connection_reset, exchange);  // none listens
      std::this_thread::sleep_until(std::min(Clock::now() + kConnectRetry, exchange.deadline));
      continue;
    }
    error_code ignored;
    socket_.set_option(tcp::no_delay(true), ignored);
    const ProbeResult hello = greet(exchange.deadline);
    if (hello.kind == Probe::accepted && hello.instance != instance_) replaced(exchange);
    switch (hello.kind) {
      case Probe::accepted: reopen_ = false; return true;
      case Probe::hung_up:  // a flooded store dropped it before the handshake (store_server.h)
        std::this_thread::sleep_until(std::min(Clock::now() + kConnectRetry, exchange.deadline));
        continue;
      case Probe::no_answer: return false;
      case Probe::wrong_token:
      case Probe::refused: {
        // Another job's store, or one that turns us away: for good.
        socket_.close(ignored);
        broken_ = hello.detail;
        throw RemoteError(hello.detail + " (store at " + where() + ", reconnecting " + exchange.what + ")");
      }
      case Probe::not_a_store: fail_with(hello.detail, exchange);
      default: fail(hello.ec, exchange);
    }
  }
  return false;
}

void Store::Impl::replaced(const Exchange& exchange) {
  error_code ignored;
  socket_.close(ignored);
  broken_ = "a store started since answers on its port";
  throw RemoteError("the store at " + where() + " is not the one this process used " + exchange.what +
                    ": it was restarted since (the launcher or rank 0 serving it started again on the same port "
                    "with the same job token) and holds none of the keys this job set, so this process cannot go on "
                    "with the job it joined");
}

void Store::Impl::fail(const error_code& ec, const Exchange& exchange) {
  error_code ignored;
  socket_.close(ignored);
  if (ec == asio::error::timed_out && exchange.slice) {
    reopen_ = true;
    throw LateAnswer{};
  }
  if (ec == asio::error::timed_out) {
    // The request's own effect is unknown (the caller learns so); the
    // connection is not: a new one serves the next request. A bounded
    // request on a failure path (a split's clean-up, the status board)
    // broke the connection of the parent it shares for good.
    reopen_ = true;
    throw TimeoutError("store at " + where() + " did not answer within " + ms_text(exchange.timeout) + " " +
                       exchange.what);
  }
  if (is_hang_up(ec)) {
    // Kept for every later request, which said only "unusable after an
    // earlier failure (it closed the connection)" (helper-132's F3).
    broken_ = "it closed the connection; the launcher or rank 0 may have exited";
    throw RemoteError("the store at " + where() + " closed the connection " + exchange.what +
                      "; the launcher or rank 0 may have exited");
  }
  broken_ = ec.message();
  throw SystemError("talking to the store at " + where() + " failed " + exchange.what + ": " + ec.message());
}

void Store::Impl::fail_with(const std::string& why, const Exchange& exchange) {
  error_code ignored;
  socket_.close(ignored);
  broken_ = why;
  throw RemoteError("the store at " + where() + " broke the protocol " + exchange.what + ": " + why);
}

// ---- Store ---------------------------------------------------------------

namespace {

// A client's own io_context takes descriptors (an epoll and an eventfd)
// before any socket: asio's bare "eventfd_select_interrupter: Too many open
// files" said nothing of the store or the remedy.
template <class Make>
auto make_impl(const std::string& where, Make make) {
  try {
    return make();
  } catch (const boost::system::system_error& e) {
    fail_if_out_of_descriptors(e.code(), where);
    throw;
  }
}

}  // namespace

Store::Store(const std::string& host, std::uint16_t port, std::string token, milliseconds connect_timeout)
    : impl_(make_impl(host + ":" + std::to_string(port), [&] {
        return std::make_unique<Impl>(host, port, std::move(token), connect_timeout);
      })) {}

Store::Store(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

std::unique_ptr<Store> Store::find(const std::string& host, const std::vector<std::uint16_t>& ports,
                                   std::string token, milliseconds timeout, const std::string& remedy) {
  auto impl = make_impl(host, [&] { return std::make_unique<Impl>(host, std::move(token), timeout); });
  impl->find(ports, timeout, remedy);
  return std::unique_ptr<Store>(new Store(std::move(impl)));
}

bool Store::takes_token(const std::string& host, std::uint16_t port, std::string token, milliseconds timeout) {
  try {
    Impl impl(host, std::move(token), timeout);
    return impl.takes_token(port, timeout);
  } catch (const std::exception&) {
    return false;
  }
}

std::uint16_t Store::port() const { return impl_->port(); }

Store::~Store() = default;

void Store::set(const std::string& key, const Bytes& value) {
  impl_->call(Command::set, set_body(key, value), "while setting key '" + key + "'");
}

void Store::set(const std::string& key, const std::string& value) {
  set(key, Bytes(value.begin(), value.end()));
}

void Store::set(const std::string& key, const std::string& value, Clock::time_point deadline) {
  impl_->call(Command::set, set_body(key, value), "while setting key '" + key + "'", std::nullopt, deadline);
}

Bytes Store::get(const std::string& key, milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  for (milliseconds slice{0};;) {
    slice = next_slice(deadline, slice, impl_->shared_lately());
    Bytes body;
    put_u32(body, wire_ms(slice));
    put_key(body, key);
    Reply reply = impl_->call(Command::get, body, "while waiting for key '" + key + "'", slice);
    if (reply.status == Status::ok) return std::move(reply.body);
    if (Clock::now() >= deadline && !reply.answered)
      throw impl_->unanswered(timeout, "while waiting for key '" + key + "'");
    if (Clock::now() >= deadline)
      throw TimeoutError("key '" + key + "' did not appear in the store at " + impl_->where() + " within " +
                         ms_text(timeout) + "; the rank that sets it may have failed or not reached that point");
  }
}

std::string Store::get_string(const std::string& key, milliseconds timeout) {
  Bytes value = get(key, timeout);
  return std::string(value.begin(), value.end());
}

std::optional<Bytes> Store::try_get(const std::string& key) { return try_get_until(key, std::nullopt); }

std::optional<Bytes> Store::try_get(const std::string& key, Clock::time_point deadline) {
  return try_get_until(key, deadline);
}

std::optional<Bytes> Store::try_get_until(const std::string& key, std::optional<Clock::time_point> deadline) {
  Bytes body;
  put_key(body, key);
  Reply reply = impl_->call(Command::try_get, body, "while reading key '" + key + "'", std::nullopt, deadline);
  if (reply.status != Status::ok) return std::nullopt;
  return std::move(reply.body);
}

void Store::wait(const std::vector<std::string>& keys, milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  Reply reply{Status::timeout, {}};
  for (milliseconds slice{0};;) {
    slice = next_slice(deadline, slice, impl_->shared_lately());
    Bytes body;
    put_u32(body, wire_ms(slice));
    put_keys(body, keys);
    reply = impl_->call(Command::wait, body, "while waiting for keys " + join_keys(keys), slice);
    if (reply.status == Status::ok) return;
    if (Clock::now() >= deadline) break;
  }
  if (!reply.answered) throw impl_->unanswered(timeout, "while waiting for keys " + join_keys(keys));
  WireReader in(reply.body);
  throw TimeoutError("keys " + join_keys(in.keys()) + " did not appear in the store at " + impl_->where() +
                     " within " + ms_text(timeout) + " (waited for " + join_keys(keys) +
                     "); the ranks that set them may have failed or not reached that point");
}

std::int64_t Store::add(const std::string& key, std::int64_t delta) { return add_until(key, delta, std::nullopt); }

std::int64_t Store::add(const std::string& key, std::int64_t delta, Clock::time_point deadline) {
  return add_until(key, delta, deadline);
}

std::int64_t Store::add_until(const std::string& key, std::int64_t delta,
                              std::optional<Clock::time_point> deadline) {
  Bytes body;
  put_i64(body, delta);
  put_key(body, key);
  Reply reply = impl_->call(Command::add, body, "while adding to key '" + key + "'", std::nullopt, deadline);
  WireReader in(reply.body);
  return in.i64();
}

std::size_t Store::remove_prefix(const std::string& prefix, const std::vector<std::string>& spare,
                                 Clock::time_point deadline) {
  Bytes body;
  put_key(body, prefix);
  put_keys(body, spare);
  Reply reply = impl_->call(Command::remove_prefix, body, "while deleting the keys under '" + prefix + "'",
                            std::nullopt, deadline);
  WireReader in(reply.body);
  return static_cast<std::size_t>(in.i64());
}

bool Store::remove(const std::string& key) {
  Bytes body;
  put_key(body, key);
  Reply reply = impl_->call(Command::remove, body, "while deleting key '" + key + "'");
  return !reply.body.empty() && reply.body[0] != 0;
}

void Store::set_request_timeout(milliseconds timeout) { impl_->set_request_timeout(timeout); }

milliseconds Store::request_timeout() const { return impl_->request_timeout(); }

}  // namespace braid::runtime
