// launch() in phases: check the options and the file-descriptor limit,
// settle the job's identity (bind and store addresses, token), start the
// guardian that outlives a killed launcher (guardian.h), serve the store,
// start the ranks one by one, supervise.
//
// Ranks start one at a time and each exec is confirmed before the next
// fork (process.cc), so a missing program is reported once, for rank 0,
// with no other rank started. The store is served before any rank starts
// (ranks connect to it at once) and is torn down only after every rank is
// gone.
#include "tools/launcher/launcher.h"

#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/prctl.h>
#include <unistd.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <deque>
#include <mutex>
#include <condition_variable>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <optional>
#include <regex>
#include <string>
#include <thread>

#include "runtime/config.h"
#include "runtime/errors.h"
#include "runtime/rank_info.h"
#include "runtime/shm_names.h"
#include "runtime/store.h"
#include "runtime/store_ports.h"
#include "tools/launcher/environment.h"
#include "tools/launcher/fd_limit.h"
#include "tools/launcher/guardian.h"
#include "tools/launcher/input.h"
#include "tools/launcher/output.h"
#include "tools/launcher/supervisor.h"

namespace braid::launcher {
namespace {

bool is_loopback(const std::string& addr) { return runtime::is_loopback_address(addr); }

bool is_wildcard(const std::string& addr) { return runtime::is_wildcard_address(addr); }

void require(bool condition, const std::string& message) {
  if (!condition) throw InvalidUsage(message);
}

// The store binds an IP address; a host name given as --master-addr is
// resolved here, once, to the address it names.
std::string numeric_address(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (int err = getaddrinfo(host.c_str(), nullptr, &hints, &found); err != 0)
    throw InvalidUsage("cannot resolve store address '" + host + "': " + gai_strerror(err));
  char text[NI_MAXHOST] = {};
  int err = getnameinfo(found->ai_addr, found->ai_addrlen, text, sizeof text, nullptr, 0,
                        NI_NUMERICHOST);
  freeaddrinfo(found);
  if (err != 0) throw SystemError("cannot format address of '" + host + "': " + gai_strerror(err));
  return text;
}

// `addr` as a numeric address (a scoped IPv6 link-local one, fe80::1%eth0,
// included, which inet_pton refuses), with port 0; null where it is none.
std::unique_ptr<addrinfo, decltype(&freeaddrinfo)> numeric_host(const std::string& addr) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICHOST;
  addrinfo* found = nullptr;
  if (getaddrinfo(addr.c_str(), "0", &hints, &found) != 0) found = nullptr;
  return {found, &freeaddrinfo};
}

// Whether `host` names an IPv6 address (false where it does not resolve:
// said where it is used).
bool is_ipv6(const std::string& host) {
  try {
    return numeric_address(host).find(':') != std::string::npos;
  } catch (const Error&) {
    return false;
  }
}

// Whether `addr` is an address of this machine (one a socket can bind).
bool is_own_address(const std::string& addr) {
  const auto found = numeric_host(numeric_address(addr));
  if (!found) return true;  // said elsewhere
  const int fd = ::socket(found->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  const bool own = fd < 0 || ::bind(fd, found->ai_addr, found->ai_addrlen) == 0 || errno != EADDRNOTAVAIL;
  if (fd >= 0) ::close(fd);
  return own;
}

// Every rank listens on BRAID_BIND_ADDR, and the ranks refuse a name. A
// host name or a mistyped address failed as "cannot resolve store address"
// (which the user never gave), one of another machine as the store's
// "cannot listen", and "localhost" on every rank after the launch (found by
// a review helper): checked once here, by its name, as numeric as the
// ranks take it.
void check_bind_address(const std::string& addr) {
  const bool numeric = numeric_host(addr) != nullptr;
  if (!numeric)
    throw InvalidUsage("BRAID_BIND_ADDR='" + addr + "' is not an IP address; the ranks listen there: give one of "
                       "this machine's addresses (127.0.0.1, or the one the other nodes reach)");
  if (!is_wildcard(addr) && !is_own_address(addr))
    throw InvalidUsage("BRAID_BIND_ADDR=" + addr + " is not an address of this machine, so the ranks cannot listen "
                       "there: give one of this machine's addresses");
}

void create_log_dir(const std::string& dir) {
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  if (error) throw SystemError("cannot create --log-dir '" + dir + "': " + error.message());
}

// An earlier job's D/rank_<r>.restart<k>.out|err of this node's ranks,
// which a job that did not restart as often left beside its own files as
// if they were its attempts' (a review helper's case). Other nodes' ranks'
// files (a shared file system) stay.
void remove_stale_restart_logs(const std::string& dir, int first_rank, int ranks) {
  static const std::regex restart_log(R"(rank_(\d+)\.restart\d+\.(out|err))");
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator(dir, error)) {
    std::smatch m;
    const std::string name = entry.path().filename().string();
    if (!std::regex_match(name, m, restart_log) || m[1].length() > 9) continue;
    const int rank = std::stoi(m[1]);
    if (rank >= first_rank && rank < first_rank + ranks) std::filesystem::remove(entry.path(), error);
  }
}

// D/rank_<r>.out, and D/rank_<r>.restart<k>.out for the k-th restart: each
// attempt's files of their own, so a restart keeps the output that says
// why the attempt before it failed (it truncated the one file).
UniqueFd open_log(const std::string& dir, int rank, int restart, const char* suffix) {
  std::string path = dir + "/rank_" + std::to_string(rank) +
                     (restart > 0 ? ".restart" + std::to_string(restart) : std::string()) + "." + suffix;
  UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (!fd.valid()) throw SystemError(errno_message("cannot open '" + path + "'", errno));
  return fd;
}

// The descriptors one rank writes to, and the launcher's ends of them (left
// invalid when the rank writes straight into its log files).
struct RankStdio {
  UniqueFd rank_out, rank_err;
  UniqueFd relay_out, relay_err;
};

RankStdio make_stdio(const std::string& log_dir, int rank, int restart) {
  RankStdio stdio;
  if (!log_dir.empty()) {
    stdio.rank_out = open_log(log_dir, rank, restart, "out");
    stdio.rank_err = open_log(log_dir, rank, restart, "err");
    return stdio;
  }
  Pipe out = make_pipe();
  Pipe err = make_pipe();
  stdio.rank_out = std::move(out.write_end);
  stdio.rank_err = std::move(err.write_end);
  stdio.relay_out = std::move(out.read_end);
  stdio.relay_err = std::move(err.read_end);
  return stdio;
}

// The rank's ends of its pipes close when this returns, so that end-of-file
// on the launcher's ends means the rank (and its group) closed them.
void start_rank(const LaunchOptions& options, const JobIdentity& job, int local_rank,
                Supervisor& supervisor, GroupWatcher& guardian, InputRelay* input) {
  int rank = job.node_rank * job.nproc_per_node + local_rank;
  RankStdio stdio = make_stdio(options.log_dir, rank, job.restart);
  UniqueFd rank_in;
  if (input != nullptr && rank == options.stdin_rank) rank_in = input->connect();
  // The rank's lines get the prefix where they are relayed, not in --log-dir files.
  const std::string line_prefix = options.log_dir.empty() ? rank_line_prefix(rank) : "";
  ProcessSpec spec{options.command, rank_environment(job, local_rank, line_prefix), rank_in.get(),
                   stdio.rank_out.get(), stdio.rank_err.get(), &guardian};
  pid_t pid = spawn(spec);
  spdlog::debug("braid-launch: started rank {} as pid {}", rank, pid);
  supervisor.add(RankProcess{rank, pid, std::move(stdio.relay_out), std::move(stdio.relay_err)});
}

// Removes what the job's ranks left in /dev/shm when an attempt ends,
// however it ends (a return, a restart, the launcher's own exception): ranks
// unlink their shared memory as soon as all peers have mapped it, and a
// rank killed before that leaves a name behind. It outlives the attempt's
// Supervisor (start_and_supervise), so it runs once every rank has been
// reaped. The note goes through say(), not spdlog, which would block on a
// stalled stderr.
class JobSegments {
 public:
  // The guardian removes them instead should the launcher be killed.
  JobSegments(const std::string& token, const std::string& run_id, Guardian& guardian)
      : prefix_(runtime::shm_run_prefix(token, run_id).substr(1)) {
    guardian.watch_segments(prefix_);
  }
  ~JobSegments() {
    try {
      if (int removed = runtime::remove_segments(prefix_))
        say("removed " + std::to_string(removed) + " shared-memory segment(s) left by failed ranks");
    } catch (...) {
      // A destructor may run while an exception unwinds: never throw.
    }
  }
  JobSegments(const JobSegments&) = delete;
  JobSegments& operator=(const JobSegments&) = delete;

 private:
  std::string prefix_;  // this run's (runtime/shm_names.h), without its '/'
};

struct Outcome {
  int status = 0;
  bool rank_failed = false;  // restartable (Supervisor::rank_failed)
  bool told = false;         // a failure the other nodes read in the store (Supervisor::told)
  bool hurried = false;      // a second signal while stopping (Supervisor::hurried)
};

// How long node 0 keeps serving the store after its ranks of a failed job
// across nodes have ended: the other nodes' ranks look for the failure at
// least every 2 s (comm/setup.cc, host_of_peer).
constexpr std::chrono::milliseconds kStoreLinger{2500};

// Whether a signal taken from the SignalCatcher outside the supervisor
// (waiting for node 0, serving the store a little longer) ends that wait:
// SIGINT, SIGTERM, SIGHUP, SIGQUIT. Ctrl-Z (SIGTSTP) stops the launcher
// there, as it would without the catcher, and SIGCONT and SIGCHLD go by.
bool ends_the_wait(int signo) {
  if (signo == SIGTSTP) ::raise(SIGSTOP);
  return signo == SIGINT || signo == SIGTERM || signo == SIGHUP || signo == SIGQUIT;
}

// Serves the store kStoreLinger longer, or until a signal ends it (Ctrl-C),
// and says whether one did: it was blocked meanwhile, and delivered only
// once the launcher restored its signal mask on the way out, which then
// died by it without its output drained or the rank's status returned.
bool linger(SignalCatcher& signals) {
  const auto end = std::chrono::steady_clock::now() + kStoreLinger;
  for (auto now = std::chrono::steady_clock::now(); now < end; now = std::chrono::steady_clock::now()) {
    pollfd ready{signals.fd(), POLLIN, 0};
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(end - now);
    if (::poll(&ready, 1, static_cast<int>(left.count())) <= 0) continue;
    for (int signo : signals.take()) {
      if (!ends_the_wait(signo)) continue;
      say("received " + signal_name(signo) + "; no longer serving the store to the other nodes");
      return true;
    }
  }
  return false;
}

// The port node 0's store answered on, once one of the lookups below has
// found it (0 before): tried first by the others. Node 0's store moves past
// a --master-port that another program holds, and a holder that never
// answers (an HTTP server) cost each lookup a probe's 2 s, longer than the
// short bounds these lookups have: none of them ever reached the store,
// and no failure crossed nodes (found by a review helper).
std::atomic<std::uint16_t> node0_store_port{0};
// A lookup's bound while that port is not known: past one silent port's
// probe (2 s), so that the store, moved to the next port, is found.
constexpr std::chrono::milliseconds kFirstLookup{3000};

std::unique_ptr<runtime::Store> find_node0_store(const JobIdentity& job, std::chrono::milliseconds bound) {
  std::vector<std::uint16_t> ports = runtime::store_port_candidates(job.store_port, job.token);
  if (const std::uint16_t known = node0_store_port.load(std::memory_order_relaxed)) {
    ports.erase(std::remove(ports.begin(), ports.end(), known), ports.end());
    ports.insert(ports.begin(), known);
  }
  auto store = runtime::Store::find(job.store_host, ports, job.token, bound, "node 0's braid-launch");
  node0_store_port.store(store->port(), std::memory_order_relaxed);
  return store;
}

// Tells the ranks of the other nodes that one of this node's failed
// (runtime::kJobFailedKey): a rank that failed before joining (a bad flag,
// an address it cannot bind) left them waiting for it until BRAID_TIMEOUT.
// Best effort, bounded: the store may be gone with node 0.
void tell_other_nodes(const LaunchOptions& options, const JobIdentity& job, const std::string& line) {
  constexpr std::chrono::milliseconds kBound{2000};
  try {
    auto store = find_node0_store(job, node0_store_port.load() != 0 ? kBound : kFirstLookup);
    // The first failure stays: a later one is mostly its consequence.
    const auto deadline = std::chrono::steady_clock::now() + kBound;
    if (!store->try_get(runtime::kJobFailedKey, deadline))
      store->set(runtime::kJobFailedKey, line + " on node " + std::to_string(options.node_rank), deadline);
  } catch (const std::exception& e) {
    spdlog::debug("braid-launch: could not tell the other nodes: {}", e.what());
  }
}

// Watches node 0's store for a failure another node told
// (runtime::kJobFailedKey) while this node's ranks run: ranks that are not
// braid's (a torch job on gloo) would wait for the failed node's until their
// own timeout, where torchrun's agents stop every node. Every 500 ms, with a
// connection of its own; a store that is gone (node 0 ended) is tried again.
class OtherNodeWatch {
 public:
  OtherNodeWatch(const LaunchOptions& options, const JobIdentity& job, Supervisor& supervisor)
      : thread_([this, &options, &job, &supervisor] { run(options, job, supervisor); }) {}
  ~OtherNodeWatch() {
    {
      std::lock_guard lock(mu_);
      done_ = true;
    }
    wake_.notify_all();
    thread_.join();
  }
  OtherNodeWatch(const OtherNodeWatch&) = delete;
  OtherNodeWatch& operator=(const OtherNodeWatch&) = delete;

 private:
  void run(const LaunchOptions& options, const JobIdentity& job, Supervisor& supervisor) {
    constexpr std::chrono::milliseconds kEvery{500}, kBound{1000};
    const std::string mine = " on node " + std::to_string(options.node_rank);
    std::unique_ptr<runtime::Store> store;
    std::unique_lock lock(mu_);
    while (!wake_.wait_for(lock, kEvery, [this] { return done_; })) {
      lock.unlock();
      try {
        if (!store) store = find_node0_store(job, node0_store_port.load() != 0 ? kBound : kFirstLookup);
        if (auto told = store->try_get(runtime::kJobFailedKey, std::chrono::steady_clock::now() + kBound)) {
          const std::string line(told->begin(), told->end());
          const bool ours = line.size() >= mine.size() && line.compare(line.size() - mine.size(), mine.size(), mine) == 0;
          if (!ours) supervisor.stop_for_other_node(line);
        }
      } catch (const std::exception& e) {
        store.reset();
        spdlog::debug("braid-launch: watching for other nodes' failures: {}", e.what());
      }
      lock.lock();
    }
  }

  std::mutex mu_;
  std::condition_variable wake_;
  bool done_ = false;
  std::thread thread_;  // last: run() uses the members above
};

// Tells node 0's store of each rank that exited with status 0 while the job
// ran on (runtime::job_exited_key): a rank that returned before creating
// its communicator left its peers waiting in set-up until BRAID_TIMEOUT.
// From a thread of its own, in order, each write bounded. What is still
// queued when this node's ranks have all ended is dropped on one node
// (nobody sets up then) and still told across nodes, where other nodes'
// ranks may be setting up.
class ExitTeller {
 public:
  ExitTeller(const LaunchOptions& options, const JobIdentity& job)
      : thread_([this, &options, &job] { run(options, job); }) {}
  ~ExitTeller() {
    {
      std::lock_guard lock(mu_);
      done_ = true;
    }
    wake_.notify_all();
    thread_.join();
  }
  ExitTeller(const ExitTeller&) = delete;
  ExitTeller& operator=(const ExitTeller&) = delete;

  void tell(int rank, std::string line) {
    {
      std::lock_guard lock(mu_);
      queue_.emplace_back(rank, std::move(line));
    }
    wake_.notify_all();
  }

 private:
  void run(const LaunchOptions& options, const JobIdentity& job) {
    // Once this node's ranks have ended (done_), the rest is told within a
    // shorter bound, and not at all once the store did not answer: node 0's
    // ends with its job, and each try cost the whole bound at every job's end.
    constexpr std::chrono::milliseconds kBound{500}, kDrainBound{100};
    const std::string where = options.nnodes > 1 ? " on node " + std::to_string(options.node_rank) : "";
    std::unique_ptr<runtime::Store> store;
    std::unique_lock lock(mu_);
    for (;;) {
      wake_.wait(lock, [this] { return done_ || !queue_.empty(); });
      if (done_ && (options.nnodes == 1 || queue_.empty())) return;
      auto [rank, line] = std::move(queue_.front());
      queue_.pop_front();
      const auto bound = done_ ? kDrainBound : node0_store_port.load() != 0 ? kBound : kFirstLookup;
      lock.unlock();
      bool told = true;
      try {
        if (!store) store = find_node0_store(job, bound);
        store->set(runtime::job_exited_key(options.nnodes * options.nproc_per_node, rank), line + where,
                   std::chrono::steady_clock::now() + bound);
      } catch (const std::exception& e) {
        store.reset();
        told = false;
        spdlog::debug("braid-launch: could not tell the store that rank {} exited: {}", rank, e.what());
      }
      lock.lock();
      if (!told && done_) return;
    }
  }

  std::mutex mu_;
  std::condition_variable wake_;
  bool done_ = false;
  std::deque<std::pair<int, std::string>> queue_;
  std::thread thread_;  // last: run() uses the members above
};

// Whatever throws, the Supervisor's destructor kills and reaps the ranks
// started so far.
Outcome start_and_supervise(const LaunchOptions& options, const JobIdentity& job, SignalCatcher& signals,
                            GroupWatcher& guardian, pid_t guardian_pid, bool adopts_orphans, InputRelay* input,
                            Supervisor::Clock::time_point job_start) {
  // Told from a thread of its own: the supervisor stops this node's other
  // ranks meanwhile (a store that is gone with node 0 takes seconds to say so).
  std::thread telling;
  struct JoinAtEnd {
    std::thread& thread;
    ~JoinAtEnd() {
      if (thread.joinable()) thread.join();
    }
  } join_telling{telling};
  ExitTeller exits(options, job);  // before the supervisor, which tells it
  Supervisor supervisor(signals, options.timeout, options.grace_period, job_start, &guardian, input);
  supervisor.adopts = adopts_orphans;
  supervisor.keep = {guardian_pid};
  if (options.nnodes > 1)
    supervisor.on_first_failure = [&](const std::string& line) {
      telling = std::thread(tell_other_nodes, std::cref(options), std::cref(job), line);
    };
  std::optional<OtherNodeWatch> watch_others;
  if (options.nnodes > 1) watch_others.emplace(options, job, supervisor);
  supervisor.on_clean_exit = [&](int rank, const std::string& line, bool others_running) {
    if (others_running || options.nnodes > 1) exits.tell(rank, line);
  };
  int started = 0;
  try {
    for (; started < options.nproc_per_node; ++started)
      start_rank(options, job, started, supervisor, guardian, input);
  } catch (const CannotExecute& e) {
    std::string line = e.what();
    if (started > 0) line += "; killing the " + std::to_string(started) + " ranks already started";
    say(line);
    // Told to the other nodes too, whose ranks would wait for this node's
    // until BRAID_TIMEOUT.
    supervisor.abort(kExitCannotExec, line);
  } catch (const std::exception& e) {
    // Stop the started ranks the orderly way, relaying what they printed;
    // should that throw as well, the destructor still kills them.
    supervisor.abort(1, std::string("its launcher could not start its ranks: ") + e.what());
    supervisor.run();
    throw;
  } catch (...) {
    supervisor.abort(1, "its launcher could not start its ranks");
    supervisor.run();
    throw;
  }
  const int status = supervisor.run();
  return {status, supervisor.rank_failed(), supervisor.told(), supervisor.hurried()};
}

}  // namespace

void validate(const LaunchOptions& options) {
  require(options.max_restarts >= 0, "--max-restarts must be at least 0, got " + std::to_string(options.max_restarts));
  require(options.max_restarts == 0 || options.nnodes == 1,
          "--max-restarts restarts the ranks of one node; a job across nodes cannot restart yet (use --nnodes 1)");
  require(!options.command.empty(),
          "no program given: use braid-launch --nproc-per-node N [options] -- PROGRAM [ARGS...]");
  require(options.nproc_per_node >= 1, "--nproc-per-node must be at least 1, got " +
                                           std::to_string(options.nproc_per_node));
  require(options.nnodes >= 1, "--nnodes must be at least 1, got " + std::to_string(options.nnodes));
  require((options.node_rank == kJoinOrderNodeRank && options.nnodes > 1) ||
              (options.node_rank >= 0 && options.node_rank < options.nnodes),
          "--node-rank " + std::to_string(options.node_rank) + " must be in [0, " +
              std::to_string(options.nnodes) + ") for --nnodes " + std::to_string(options.nnodes));
  require(options.master_port >= 0 && options.master_port <= 65535,
          "--master-port " + std::to_string(options.master_port) + " is not a TCP port (1..65535, or 0 for a free one)");
  require(options.nnodes == 1 || options.master_port > 0,
          "--master-port is required with --nnodes > 1: every node must know where node 0 "
          "serves the store");
  require(!options.master_addr.empty(), "--master-addr must not be empty");
  require(options.timeout.count() >= 0, "--timeout must not be negative");
  require(options.grace_period.count() >= 0, "--grace-period must not be negative");
  require(options.timeout <= kMaxDuration, "--timeout must be at most 1e9 s (about 31 years)");
  require(options.grace_period <= kMaxDuration, "--grace-period must be at most 1e9 s (about 31 years)");
  const long long world = static_cast<long long>(options.nnodes) * options.nproc_per_node;
  require(options.stdin_rank == kNoStdinRank || (options.stdin_rank >= 0 && options.stdin_rank < world),
          "--stdin " + std::to_string(options.stdin_rank) + " is not a rank of this job (0.." +
              std::to_string(world - 1) + ") nor 'none'");
}

StoreEndpoints store_endpoints(const LaunchOptions& options, const std::string& bind_addr) {
  StoreEndpoints endpoints{bind_addr, options.master_addr};
  // "localhost" stays on the bind address: the launcher and the ranks may
  // resolve it to different families (::1, 127.0.0.1).
  const bool other_loopback = is_loopback(options.master_addr) && options.master_addr != "localhost" &&
                              options.master_addr != bind_addr;
  if (is_loopback(bind_addr) && (!is_loopback(options.master_addr) || other_loopback))
    endpoints.listen_addr = options.master_addr;
  else if (options.nnodes == 1 && is_loopback(options.master_addr) && !is_loopback(bind_addr) &&
           !is_wildcard(bind_addr))
    endpoints.advertised_addr = bind_addr;
  else if (is_wildcard(bind_addr) && bind_addr.find(':') == std::string::npos && is_ipv6(options.master_addr))
    endpoints.listen_addr = "::";  // 0.0.0.0 took IPv4 only: the ranks, told an IPv6 --master-addr, found nothing
  return endpoints;
}

namespace {

// A job across nodes needs its ranks to listen where the other nodes can
// reach them; with BRAID_BIND_ADDR unset (loopback) that is the address
// that routes to the master, found now so that a node without one fails at
// once saying what to set, instead of leaving the others waiting.
std::string bind_address(const LaunchOptions& options, const std::string& configured) {
  if (options.nnodes == 1 || !is_loopback(configured) || is_loopback(options.master_addr)) return configured;
  std::string found =
      runtime::local_address_toward(options.master_addr, static_cast<std::uint16_t>(options.master_port));
  spdlog::info("braid-launch: BRAID_BIND_ADDR is not set; ranks listen on {}, the address that routes to {}",
               found, options.master_addr);
  return found;
}

void check_fd_limit(const LaunchOptions& options, const runtime::Config& config) {
  FdNeeds needs = estimate_fd_needs(options, config.tcp_nsocks, config.transport == "tcp",
                                    runtime::kMinPendingHandshakes);
  fit_fd_limit(needs, options.nproc_per_node);
}

JobIdentity settle_identity(const LaunchOptions& options, const StoreEndpoints& endpoints,
                            const std::string& bind_addr) {
  JobToken token = job_token(options.nnodes, options.node_rank);
  if (token.generated) say(token_instruction(token.token));
  JobIdentity job{options.nproc_per_node, options.nnodes, options.node_rank, endpoints.advertised_addr,
                  static_cast<std::uint16_t>(options.master_port), token.token, ""};
  if (bind_addr != runtime::config().bind_addr) job.bind_addr = bind_addr;
  // Not secret (checkpoints record it): random, or the caller's.
  const char* run_id = std::getenv("BRAID_RUN_ID");
  job.run_id = run_id && *run_id ? run_id : random_token().substr(0, 16);
  job.max_restarts = options.max_restarts;
  return job;
}

// The store on the first free port of the job's sequence from --master-port
// (runtime/store_ports.h): a second job given the same port moves on. Ranks
// on this node are told the port it got; ranks on other nodes, told
// --master-port, find it by the token.
std::unique_ptr<runtime::StoreServer> serve_store(const LaunchOptions& options, const StoreEndpoints& endpoints,
                                                  JobIdentity& job) {
  std::string listen_addr = numeric_address(endpoints.listen_addr);
  auto server = std::make_unique<runtime::StoreServer>(
      listen_addr, runtime::store_port_candidates(static_cast<std::uint16_t>(options.master_port), job.token),
      job.token, "pass --master-port a port that is free here, or leave it out to let braid-launch pick one");
  job.store_port = server->port();
  node0_store_port.store(job.store_port, std::memory_order_relaxed);
  // --master-port taken by this very job: a second node 0 (two launchers
  // given --node-rank 0, or one beside a node 0 numbered in join order),
  // whose ranks and the first's each waited out BRAID_TIMEOUT for the rest.
  if (options.nnodes > 1 && job.store_port != options.master_port) {
    bool ours = false;
    try {
      runtime::Store::find(listen_addr, {static_cast<std::uint16_t>(options.master_port)}, job.token,
                           std::chrono::milliseconds(1000), "");
      ours = true;
    } catch (const Error&) {
      // Another program's port, or another job's store: moving on is right.
    }
    if (ours)
      throw InvalidUsage("another node 0 of this job already serves the store at " + listen_addr + ":" +
                         std::to_string(options.master_port) + " (two launchers given --node-rank 0, or one beside "
                         "a node 0 numbered as it joined): start each node once, every one with its own "
                         "--node-rank or none with it");
  }
  spdlog::info("braid-launch: store listening on {}:{}", listen_addr, job.store_port);
  return server;
}

// Node ranks in join order, for nodes not given --node-rank (torchrun's
// c10d rendezvous needs none): node 0 is the launcher that serves the store
// on --master-port of --master-addr, which only one on that address's
// machine can bind; every other node finds that store, by the token, and
// takes the next number from a counter in it. Every node must share
// BRAID_JOB_TOKEN, since none knows it is node 0 before it binds.
constexpr const char* kJoinCounterKey = "braid/launch/nodes_joined";

// What stopped the wait for node 0 (join_order_node_rank): a signal, or
// 0 for --timeout.
struct StoppedWaiting {
  int signo;
};

int join_order_node_rank(const LaunchOptions& options, const StoreEndpoints& endpoints, SignalCatcher& signals,
                         std::unique_ptr<runtime::StoreServer>& served) {
  const char* shared = std::getenv("BRAID_JOB_TOKEN");
  if (!shared || !*shared)
    throw InvalidUsage("--nnodes " + std::to_string(options.nnodes) + " without --node-rank numbers the nodes as "
                       "they reach node 0's store, so every node needs the same BRAID_JOB_TOKEN (e.g. from `openssl "
                       "rand -hex 16`); or pass --node-rank (0 on the node at --master-addr)");
  const std::string token = shared;
  const auto port = static_cast<std::uint16_t>(options.master_port);
  std::exception_ptr bind_failure;
  if (is_own_address(options.master_addr)) {
    try {
      served = std::make_unique<runtime::StoreServer>(numeric_address(endpoints.listen_addr),
                                                      std::vector<std::uint16_t>{port}, token, "");
      spdlog::info("braid-launch: node 0 of {} (it serves the store on {}:{})", options.nnodes,
                   endpoints.listen_addr, port);
      return 0;
    } catch (const SystemError&) {
      bind_failure = std::current_exception();  // another launcher of this job may hold it
    }
  }
  // From this machine, another launcher of the job has the port by now, or
  // the port is taken by something else; from elsewhere, node 0 may start
  // later, as under torchrun, so wait as long as ranks wait for each other.
  // Asked in slices of 1 s, between which a signal (Ctrl-C) ends the wait:
  // the SignalCatcher holds them back.
  std::chrono::milliseconds wait = bind_failure ? std::chrono::milliseconds(3000) : runtime::config().timeout;
  const bool job_timeout_first = options.timeout.count() > 0 && options.timeout < wait;  // --timeout covers it
  if (job_timeout_first) wait = options.timeout;
  const auto start = std::chrono::steady_clock::now();
  const auto deadline = start + wait;
  bool said = false;
  std::unique_ptr<runtime::Store> store;
  while (!store) {
    const auto now = std::chrono::steady_clock::now();
    const auto slice = std::min<std::chrono::steady_clock::duration>(std::chrono::seconds(1), deadline - now);
    try {
      store = runtime::Store::find(options.master_addr, runtime::store_port_candidates(port, token), token,
                                   std::chrono::ceil<std::chrono::milliseconds>(slice),
                                   "start the node at --master-addr, or pass --node-rank");
    } catch (const RemoteError&) {
      // A store that refused this token: another job's, or node 0's given
      // another BRAID_JOB_TOKEN; said as it is, not as the bind failure.
      if (std::chrono::steady_clock::now() >= deadline) throw;
    } catch (const Error&) {
      if (std::chrono::steady_clock::now() >= deadline) {
        if (job_timeout_first) throw StoppedWaiting{0};
        if (bind_failure) std::rethrow_exception(bind_failure);
        throw;
      }
    }
    for (int signo : signals.take())
      if (ends_the_wait(signo)) throw StoppedWaiting{signo};
    if (!store && !said && std::chrono::steady_clock::now() - start >= std::chrono::seconds(5)) {
      said = true;
      say("waiting for node 0's store at " + options.master_addr + ":" + std::to_string(port) + " (up to " +
          std::to_string(wait.count() / 1000) + " s): start the node at --master-addr, or pass --node-rank");
    }
  }
  node0_store_port.store(store->port(), std::memory_order_relaxed);  // for the lookups that tell it of failures
  // A store still up for a job that failed (node 0 serves 2.5 s longer for
  // its other nodes): a node joining it would take part in nothing.
  if (store->try_get(runtime::kJobFailedKey))
    throw SystemError("node 0's store at " + options.master_addr + ":" + std::to_string(store->port()) +
                      " belongs to a job that has failed and is ending; start this node again once it has ended");
  const std::int64_t rank = store->add(kJoinCounterKey, 1);
  if (rank >= options.nnodes)
    throw InvalidUsage("node " + std::to_string(rank) + " joined a job of --nnodes " + std::to_string(options.nnodes) +
                       ": more launchers than nodes reached node 0's store (one node started twice?)");
  spdlog::info("braid-launch: node {} of {} (numbered as the nodes reached node 0's store)", rank, options.nnodes);
  return static_cast<int>(rank);
}

}  // namespace

int launch(const LaunchOptions& given) {
  validate(given);
  LaunchOptions options = given;
  // Every rank, this node's too, connects to the store at --master-addr. An
  // address of another machine is right only when it forwards to this one
  // (a Kubernetes service, a cloud NAT or floating address); a mistyped one
  // left every node waiting until BRAID_TIMEOUT. Said, not refused.
  if (options.node_rank == 0 && options.nnodes > 1 && !is_own_address(options.master_addr))
    spdlog::warn("braid-launch: --master-addr {} is not an address of this machine (node 0, which serves the "
                 "store); every rank connects there, so it must forward to this machine (a service or NAT "
                 "address), or the ranks wait until BRAID_TIMEOUT",
                 options.master_addr);
  const runtime::Config& config = runtime::config();
  check_bind_address(config.bind_addr);
  check_fd_limit(options, config);
  std::string bind_addr = bind_address(options, config.bind_addr);
  StoreEndpoints endpoints = store_endpoints(options, bind_addr);
  // Before a node takes its number (join order), which a later failure
  // would leave taken.
  if (!options.log_dir.empty()) create_log_dir(options.log_dir);
  SignalCatcher signals;  // before the store's thread starts (signals.h)
  std::unique_ptr<runtime::StoreServer> joined_server;  // node 0's in join order: its first attempt's store
  if (options.node_rank == kJoinOrderNodeRank) {
    try {
      options.node_rank = join_order_node_rank(options, endpoints, signals, joined_server);
    } catch (const StoppedWaiting& stopped) {
      if (stopped.signo == 0) {
        char seconds[32];
        std::snprintf(seconds, sizeof seconds, "%g", static_cast<double>(options.timeout.count()) / 1000.0);
        say(std::string("the job ran past its --timeout of ") + seconds +
            " s while this node waited for node 0's store");
        return kExitTimeout;
      }
      say("received " + signal_name(stopped.signo) + " while waiting for node 0's store");
      return 128 + stopped.signo;
    }
  }
  JobIdentity job = settle_identity(options, endpoints, bind_addr);
  // After the SignalCatcher, which ignores SIGPIPE for the guardian's pipe
  // too, and before the first rank. It holds twice the ranks of this node:
  // one attempt's groups, and room for those a restart could not reap.
  Guardian guardian(2 * static_cast<std::size_t>(options.nproc_per_node) + 16, options.grace_period);
  // What a rank starts outside its process group and leaves orphaned comes
  // to this process, not to init, so that it ends with the job
  // (Supervisor::adopts); after the guardian's fork, which does not inherit
  // it.
  const bool adopts_orphans = prctl(PR_SET_CHILD_SUBREAPER, 1) == 0;
  const auto started = std::chrono::steady_clock::now();
  // Only the node that holds the reading rank touches its stdin.
  std::optional<InputRelay> input;
  const int first_rank = options.node_rank * options.nproc_per_node;
  if (!options.log_dir.empty()) remove_stale_restart_logs(options.log_dir, first_rank, options.nproc_per_node);
  if (options.stdin_rank >= first_rank && options.stdin_rank < first_rank + options.nproc_per_node)
    input.emplace(STDIN_FILENO);
  // Each attempt gets a store and a token of its own, so that no rank of a
  // restarted job reads what the failed one left in the store.
  for (;; ++job.restart) {
    std::unique_ptr<runtime::StoreServer> server = std::move(joined_server);
    if (server) node0_store_port.store(job.store_port = server->port(), std::memory_order_relaxed);
    else if (options.node_rank == 0) server = serve_store(options, endpoints, job);
    if (options.node_rank == 0 && options.nnodes > 1 && job.restart == 0 &&
        is_loopback(numeric_address(endpoints.listen_addr)))
      spdlog::warn("braid-launch: --nnodes {} with the store on {}, which only this machine reaches: other nodes "
                   "need --master-addr set to an address of this node that they reach, here and on them",
                   options.nnodes, endpoints.listen_addr);
    job.torch_port = torch_store_port(numeric_address(endpoints.listen_addr), options.nnodes,
                                      options.nnodes > 1 ? options.master_port : job.store_port);
    Outcome outcome;
    {
      const JobSegments segments(job.token, job.run_id, guardian);
      outcome = start_and_supervise(options, job, signals, guardian, guardian.pid(), adopts_orphans,
                                    input ? &*input : nullptr, started);
    }
    if (input) input->disconnect();
    // Node 0's ranks end at once on a failure, and its store went with
    // them while other nodes' ranks had yet to read why (they look every
    // 2 s at most): it serves a little longer. So too where node 0's
    // launcher was stopped by a signal or its --timeout: the other nodes'
    // launchers, not told, ran their ranks on to the end and exited 0.
    // Not after a second Ctrl-C, which the first one's linger would have
    // ended at once, too.
    if (server && options.nnodes > 1 && (outcome.rank_failed || outcome.told) &&
        (outcome.hurried || linger(signals)))
      return outcome.status;
    if (!outcome.rank_failed || job.restart >= options.max_restarts) return outcome.status;
    // A job piped into `head` whose ranks died writing to it once head had
    // gone: another attempt would die the same way, restart after restart.
    if (standard_sink(STDOUT_FILENO).reader_gone() || standard_sink(STDERR_FILENO).reader_gone()) {
      say("not restarting: the reader of its output has gone");
      return outcome.status;
    }
    say("restarting all " + std::to_string(options.nproc_per_node) + " ranks (restart " +
        std::to_string(job.restart + 1) + " of at most " + std::to_string(options.max_restarts) + ")");
    job.token = random_token();
    job.store_port = static_cast<std::uint16_t>(options.master_port);
  }
}

}  // namespace braid::launcher
