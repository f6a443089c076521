// Creating communicators: the world one from the launcher's environment, and
// split ones from a parent.
//
// Store keys of a communicator live under its key prefix ("braid/world",
// "braid/world<n>" for the n-th world a process creates on one job's store,
// then "<parent>/split<k>/color<c>" for the k-th split of a parent), so
// communicators never read each other's addresses or status. The
// communicator id on the wire is a hash of the prefix.
#include <boost/system/system_error.hpp>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <system_error>
#include <vector>

#include "comm/communicator_impl.h"
#include "comm/resources.h"
#include "comm/transport/ibverbs/connect.h"
#include "comm/transport/shm/transport.h"
#include "comm/transport/tcp/transport.h"
#include "runtime/config.h"
#include "runtime/errors.h"
#include "runtime/hash.h"
#include "runtime/log.h"
#include "runtime/rank_info.h"
#include "runtime/store.h"
#include "runtime/store_ports.h"
#include "runtime/topology.h"

namespace braid::comm {
namespace {

// The id that names a communicator in the log and in every message header:
// its store prefix within its job, so that two jobs' (or two torch groups',
// each of which is a job of its own) communicators of the same prefix, say
// "braid/world", do not log as one and cannot take each other's messages.
std::uint32_t communicator_id(const std::string& job_token, const std::string& prefix) {
  return static_cast<std::uint32_t>(runtime::fnv1a(job_token + "/" + prefix));
}

// A second world on the job's store (every rank creates its worlds in the
// same order) read the first one's addresses and shared-memory names under
// the same prefix, and failed on stale ones or waited out BRAID_TIMEOUT. The
// store rank 0 serves (no launcher) stays up until the process exits
// (atexit, before the statics its thread may use), as every world of the
// job shares it: one world's end no longer takes the store from under a
// peer that already went on to the next.
struct JobStores {
  unsigned born_in = fork_generation();
  std::mutex mu;
  std::map<std::string, int> worlds;                                     // by job: worlds made
  std::map<std::string, std::shared_ptr<runtime::StoreServer>> served;  // by job: rank 0's server
};

JobStores& job_stores() {
  static auto* stores = new JobStores;  // its servers stop at exit (job_store_server)
  return *stores;
}

// With `stores.mu` held: in a child forked since, the counts and servers
// are the parent's (the servers without their threads); the child starts
// afresh, leaving them alone.
void forget_parent(JobStores& stores) {
  if (stores.born_in == fork_generation()) return;
  new auto(std::move(stores.served));
  stores.served.clear();
  stores.worlds.clear();
  stores.born_in = fork_generation();
}

std::string job_key(const runtime::RankInfo& info) {
  return info.store_host + ":" + std::to_string(info.store_port) + "/" + info.job_token;
}

std::string next_world_prefix(const runtime::RankInfo& info) {
  JobStores& stores = job_stores();
  std::lock_guard lock(stores.mu);
  forget_parent(stores);
  const int made = stores.worlds[job_key(info)]++;
  return made == 0 ? "braid/world" : "braid/world" + std::to_string(made + 1);
}

std::shared_ptr<runtime::StoreServer> job_store_server(const runtime::RankInfo& info) {
  JobStores& stores = job_stores();
  std::lock_guard lock(stores.mu);
  forget_parent(stores);
  auto& server = stores.served[job_key(info)];
  if (server) return server;
  server = runtime::serve_job_store(info);
  static const bool stop_at_exit = std::atexit([] {
    JobStores& all = job_stores();
    std::lock_guard lock(all.mu);
    forget_parent(all);  // a forked child's copies are the parent's servers, without threads
    all.served.clear();
  }) == 0;
  (void)stop_at_exit;
  return server;
}

std::shared_ptr<Communicator::Impl> new_impl(const runtime::RankInfo& info, const runtime::Config& config,
                                             std::string prefix, int rank, int size) {
  auto impl = std::make_shared<Communicator::Impl>();
  impl->config = config;
  impl->info = info;
  impl->rank = rank;
  impl->size = size;
  impl->key_prefix = std::move(prefix);
  impl->born_in = fork_generation();
  impl->comm_id = communicator_id(info.job_token, impl->key_prefix);
  impl->exchange.comm_id = impl->comm_id;
  impl->exchange.rank = rank;
  impl->exchange.size = size;
  impl->exchange.timeout_name = config.timeout_name;
  impl->exchange.tuning.segment_bytes = config.segment_bytes;
  impl->exchange.tuning.chunk_bytes = config.chunk_bytes;
  impl->exchange.tuning.stream_bytes = config.stream_bytes;
  impl->exchange.direct_workers = config.direct_workers == "one"   ? DirectWorkers::one
                                  : config.direct_workers == "all" ? DirectWorkers::all
                                                                   : DirectWorkers::automatic;
  impl->forced_algo = config.algo;
  impl->timeout = config.timeout;
  impl->inline_bytes = config.inline_bytes;
  return impl;
}

// "under openmpi", "without a launcher": how the job's ranks were started.
std::string started(const runtime::RankInfo& info) {
  return info.launcher == "none" ? "without a launcher" : "under " + info.launcher;
}

std::string ring_order(int size) {
  std::string order;
  for (int r = 0; r < size; ++r) order += (r ? " " : "") + std::to_string(r);
  return order;
}

}  // namespace

namespace {

// Which transport reaches each peer. BRAID_TRANSPORT=auto: shared memory
// for ranks on this host; RDMA for ranks on other hosts when both ends have
// a usable verbs device (rdma_ability), TCP otherwise. tcp puts every peer
// on TCP, ibverbs every peer on RDMA, shm refuses ranks on other hosts.
struct Plan {
  std::vector<int> local;    // ranks on this host, this one included, sorted
  std::vector<bool> use_shm, use_tcp, use_ib;
  std::string why;  // for the info log: why ranks of other hosts got what they got
};

// Under auto with ranks on other hosts: every rank publishes whether it can
// use RDMA ("ok|<device>" or "no|<reason>") under <prefix>/ib/<rank>, and
// reads those of the ranks on other hosts. Both ends of a pair read the same
// two answers, so they agree on its transport.
std::vector<std::string> rdma_ability(const Communicator::Impl& impl, const std::vector<bool>& remote) {
  std::vector<std::string> ability(static_cast<std::size_t>(impl.size));
  std::string chosen;
  std::string reason = ibverbs::unusable_reason({impl.config.ib_hca, impl.config.ib_gid_index}, impl.rank, chosen);
  ability[impl.rank] = reason.empty() ? "ok|" + chosen : "no|" + reason;
  const std::string key = impl.key_prefix + "/ib/";
  impl.store->set(key + std::to_string(impl.rank), ability[impl.rank]);
  for (int peer = 0; peer < impl.size; ++peer)
    if (remote[peer]) ability[peer] = impl.store->get_string(key + std::to_string(peer), impl.timeout);
  return ability;
}

void choose_between_hosts(const Communicator::Impl& impl, Plan& plan, const std::vector<bool>& remote) {
  std::vector<std::string> ability = rdma_ability(impl, remote);
  auto usable = [&](int r) { return ability[r].rfind("ok|", 0) == 0; };
  std::string without;
  for (int peer = 0; peer < impl.size; ++peer) {
    if (!remote[peer]) continue;
    if (usable(impl.rank) && usable(peer)) plan.use_ib[peer] = true;
    else plan.use_tcp[peer] = true;
    if (!usable(peer)) without += "; rank " + std::to_string(peer) + ": " + ability[peer].substr(3);
  }
  if (!usable(impl.rank))
    plan.why = "other hosts over tcp: this rank cannot use RDMA (" + ability[impl.rank].substr(3) + ")";
  else if (!without.empty())
    plan.why = "RDMA with " + ability[impl.rank].substr(3) + " to ranks that have a device; tcp to those that do not" + without;
  else
    plan.why = "other hosts over RDMA: every end has a verbs device (this rank's: " + ability[impl.rank].substr(3) + ")";
}

Plan plan_transports(const Communicator::Impl& impl) {
  Plan plan;
  const std::string& mode = impl.config.transport;
  plan.use_shm.assign(impl.size, false);
  plan.use_tcp.assign(impl.size, false);
  plan.use_ib.assign(impl.size, false);
  std::vector<bool> remote(static_cast<std::size_t>(impl.size), false);
  std::string remote_list;
  for (int peer = 0; peer < impl.size; ++peer) {
    bool same_host = impl.hosts[peer] == impl.hosts[impl.rank];
    if (same_host) plan.local.push_back(peer);
    if (peer == impl.rank) continue;
    if (mode == "ibverbs") plan.use_ib[peer] = true;
    else if (same_host && mode != "tcp") plan.use_shm[peer] = true;
    else if (mode == "tcp") plan.use_tcp[peer] = true;
    if (!same_host) remote[peer] = true;
    if (!same_host) remote_list += (remote_list.empty() ? "" : ", ") + std::to_string(peer);
  }
  if (mode == "shm" && !remote_list.empty())
    throw InvalidUsage("BRAID_TRANSPORT=shm, but rank(s) " + remote_list + " run on another host than rank " +
                       std::to_string(impl.rank) + "; use BRAID_TRANSPORT=auto to reach them over TCP or RDMA");
  if (mode == "auto" && !remote_list.empty()) choose_between_hosts(impl, plan, remote);
  if (plan.why.empty())  // logged after "BRAID_TRANSPORT=<mode>": it read "BRAID_TRANSPORT=auto (BRAID_TRANSPORT=auto)"
    plan.why = mode == "auto" ? "one host: shm to every peer" : "as set";
  return plan;
}

std::string rank_list(const std::vector<bool>& mask) {
  std::string list;
  for (std::size_t r = 0; r < mask.size(); ++r)
    if (mask[r]) list += (list.empty() ? "" : ",") + std::to_string(r);
  return list.empty() ? "none" : list;
}

void add_routes(Communicator::Impl& impl, const std::vector<bool>& mask) {
  for (int peer = 0; peer < impl.size; ++peer)
    if (mask[peer]) impl.exchange.routes[peer] = impl.transports.back().get();
  impl.exchange.distinct.push_back(impl.transports.back().get());
}

bool any(const std::vector<bool>& mask) { return std::find(mask.begin(), mask.end(), true) != mask.end(); }

// Descriptors and threads the transports of `plan` take (comm/resources.h).
ResourceNeeds needs_of(const Plan& plan, const runtime::Config& config) {
  const auto shm_peers = std::count(plan.use_shm.begin(), plan.use_shm.end(), true);
  const auto tcp_peers = std::count(plan.use_tcp.begin(), plan.use_tcp.end(), true);
  ResourceNeeds needs;
  // shm: a pidfd per peer, and one descriptor while a segment is created or mapped.
  if (shm_peers > 0) needs.fds += static_cast<int>(shm_peers) + 1;
  // tcp: the sockets and the transport's wake-up eventfd, and while they
  // connect the listening socket and Asio's epoll, eventfd and timerfd.
  if (tcp_peers > 0) needs.fds += static_cast<int>(tcp_peers) * config.tcp_nsocks + 5;
  // ibverbs: the device's command and async descriptors, the completion
  // channel and the transport's wake-up eventfd.
  if (any(plan.use_ib)) needs.fds += 5;
  needs.threads = 2;  // the status board's and the progress thread
  return needs;
}

// Where ranks publish why they cannot create a communicator, as
// "<rank>|<reason>": found short of resources by the check, or failed later.
enum class Stage { check, connect };
std::string failure_key(const Communicator::Impl& impl, Stage stage) {
  return stage == Stage::check ? impl.key_prefix + "/setup/short" : setup_failed_key(impl.key_prefix);
}

// Bounded by `deadline` where one is given: a store that does not answer
// by then is not waited for further.
std::optional<std::pair<int, std::string>> published_failure(
    Communicator::Impl& impl, Stage stage, std::optional<std::chrono::steady_clock::time_point> deadline = {}) {
  std::optional<runtime::Bytes> value;
  try {
    value = deadline ? impl.store->try_get(failure_key(impl, stage), *deadline)
                     : impl.store->try_get(failure_key(impl, stage));
  } catch (const Error&) {
    return std::nullopt;  // the store is gone too; the caller's own error stands
  }
  if (!value) return std::nullopt;
  std::string text(value->begin(), value->end());
  auto bar = text.find('|');
  return std::make_pair(std::atoi(text.c_str()), bar == std::string::npos ? text : text.substr(bar + 1));
}

// The first failure published stays (a later one is mostly its echo).
// Bounded by `deadline` where one is given, as published_failure is.
void publish_failure(Communicator::Impl& impl, Stage stage, const std::string& reason,
                     std::optional<std::chrono::steady_clock::time_point> deadline = {}) {
  if (!impl.store || impl.size == 1 || published_failure(impl, stage, deadline)) return;
  try {
    const std::string value = std::to_string(impl.rank) + "|" + reason;
    if (deadline)
      impl.store->set(failure_key(impl, stage), value, *deadline);
    else
      impl.store->set(failure_key(impl, stage), value);
  } catch (const Error&) {
    // Best effort: peers then time out waiting for this rank, naming it.
  }
}

RemoteError peer_failed(const Communicator::Impl& impl, const std::pair<int, std::string>& failure) {
  return RemoteError("rank " + std::to_string(impl.rank) + " cannot create communicator " + impl.key_prefix +
                         " because rank " + std::to_string(failure.first) + " could not: " + failure.second,
                     failure.first);
}

// Throws where a rank published that it could not set up this
// communicator, or braid-launch that a rank of another node failed before
// it joined (runtime::kJobFailedKey): what set-up's waits look at between
// their slices. Bounded by the wait's `deadline`: where the store stopped
// answering, each look took up to BRAID_TIMEOUT, so that the wait overran
// its own deadline by twice that before its error (a review helper's case).
void throw_if_peer_failed(Communicator::Impl& impl, std::chrono::steady_clock::time_point deadline) {
  if (auto failure = published_failure(impl, Stage::connect, deadline)) throw peer_failed(impl, *failure);
  std::optional<runtime::Bytes> failed;
  try {
    failed = impl.store->try_get(runtime::kJobFailedKey, deadline);
  } catch (const Error&) {
  }
  if (failed)
    throw RemoteError("rank " + std::to_string(impl.rank) + " cannot create communicator " + impl.key_prefix +
                      ": braid-launch reports " + std::string(failed->begin(), failed->end()));
}

// Every rank checks what this communicator will take before it takes
// anything, and the ranks agree on the outcome through the store: a rank
// short of descriptors or threads fails with its reason, every other rank
// at once with a RemoteError carrying it, rather than waiting for it until
// the timeout. A failure is published before the vote, so whoever has seen
// every vote sees it. A rank serving the store waits for every rank to have
// read the outcome before it fails (its store goes with it).
void agree_on_resources(Communicator::Impl& impl, const Plan& plan) {
  std::string problem;
  try {
    check_resources(impl.rank, needs_of(plan, impl.config));
  } catch (const SystemError& e) {
    problem = e.what();
  }
  if (!impl.store || impl.size == 1) {
    if (!problem.empty()) throw SystemError(problem);
    return;
  }
  if (!problem.empty()) publish_failure(impl, Stage::check, problem);
  const std::string votes = impl.key_prefix + "/setup/checked/", seen = impl.key_prefix + "/setup/seen/";
  impl.store->set(votes + std::to_string(impl.rank), problem.empty() ? "ok" : "short");
  std::vector<std::string> all_votes, all_seen;
  for (int r = 0; r < impl.size; ++r) {
    all_votes.push_back(votes + std::to_string(r));
    all_seen.push_back(seen + std::to_string(r));
  }
  impl.store->wait(all_votes, impl.timeout);
  auto failure = published_failure(impl, Stage::check);
  if (!failure) return;
  impl.store->set(seen + std::to_string(impl.rank), "1");
  if (impl.store_server) impl.store->wait(all_seen, impl.timeout);
  if (!problem.empty()) throw SystemError(problem);
  throw peer_failed(impl, *failure);
}

// Set-up failed on this rank after the resource check (in flight). A braid
// error stays as it is; Asio's and the standard library's system errors
// (EMFILE, a thread that cannot start) become a SystemError naming the
// limit. The reason goes to the store, where the peers whose own waits time
// out find it, and a timeout here reports a peer's published failure.
//
// Its calls on the store are bounded (2 s at most): where the store itself
// stopped answering, each took up to BRAID_TIMEOUT, three of them after the
// wait that had already run out.
[[noreturn]] void fail_setup(Communicator::Impl& impl) {
  const std::string who = "rank " + std::to_string(impl.rank) + " could not set up communicator " +
                          impl.key_prefix + ": ";
  const auto bound = std::chrono::steady_clock::now() +
                     std::min<std::chrono::milliseconds>(impl.timeout, std::chrono::seconds(2));
  auto publish = [&](const char* reason) { publish_failure(impl, Stage::connect, reason, bound); };
  try {
    throw;
  } catch (const TimeoutError& e) {
    if (impl.store)
      if (auto failure = published_failure(impl, Stage::connect, bound); failure && failure->first != impl.rank)
        throw peer_failed(impl, *failure);
    publish(e.what());
    throw;
  } catch (const Error& e) {
    publish(e.what());
    throw;
  } catch (const boost::system::system_error& e) {
    SystemError error(who + e.what() + fd_limit_hint(e.code().value()));
    publish(error.what());
    throw error;
  } catch (const std::system_error& e) {
    const bool thread = e.code() == std::errc::resource_unavailable_try_again;
    SystemError error(who + e.what() + (thread ? thread_limit_hint() : fd_limit_hint(e.code().value())));
    publish(error.what());
    throw error;
  } catch (const std::exception& e) {
    SystemError error(who + e.what());
    publish(error.what());
    throw error;
  }
}

// A transport's options with the fields every transport shares filled in.
template <typename Options>
Options with_common(const ConnectOptions& common) {
  Options options;
  static_cast<ConnectOptions&>(options) = common;
  return options;
}

void connect_planned(Communicator::Impl& impl, const Plan& plan) {
  const auto& config = impl.config;
  // Spinning only pays when every local rank has a core of its own: as
  // many distinct CPUs in the local ranks' affinities together as there are
  // local ranks. Each rank's own affinity is not the measure: ranks bound
  // one per core (mpirun --bind-to core, srun --cpu-bind, taskset) see one
  // CPU each, yet none shares it.
  std::vector<std::string> local_cpus;
  for (int r : plan.local) local_cpus.push_back(impl.cpus[r]);
  const int cpus = runtime::distinct_cpus(local_cpus);
  const bool oversubscribed = static_cast<int>(plan.local.size()) > (cpus > 0 ? cpus : runtime::available_cores());
  auto spin = std::chrono::microseconds(oversubscribed ? 0 : config.spin_us);
  ConnectOptions common;
  common.rank = impl.rank;
  common.size = impl.size;
  common.comm_id = impl.comm_id;
  common.job_token = impl.info.job_token;
  common.run_id = impl.info.run_id;
  common.spin = spin;
  common.timeout = config.timeout;
  common.check_peers = [&impl](std::chrono::steady_clock::time_point deadline) {
    throw_if_peer_failed(impl, deadline);
  };
  common.announce_failure = [&impl](const std::string& why) {
    publish_failure(impl, Stage::connect, why,
                    std::chrono::steady_clock::now() +
                        std::min<std::chrono::milliseconds>(impl.timeout, std::chrono::seconds(2)));
  };
  if (any(plan.use_shm)) {
    auto options = with_common<shm::ShmOptions>(common);
    options.local_ranks = plan.local;
    options.ring_bytes = config.shm_ring_bytes;
    options.host_bytes = config.shm_host_bytes;
    impl.transports.push_back(shm::connect_shm(*impl.store, impl.key_prefix, options));
    add_routes(impl, plan.use_shm);
    impl.cuda_ipc = with_common<cuda_ipc::CudaIpcOptions>(common);  // device memory of the same peers
    impl.cuda_ipc->local_ranks = plan.local;
  }
  if (any(plan.use_tcp)) {
    auto options = with_common<tcp::TcpOptions>(common);
    options.nsocks = config.tcp_nsocks;
    options.buffer_bytes = config.socket_buffer_bytes;
    options.bind_addr = runtime::peer_bind_address(impl.info, config);  // routable across hosts
    // Listening on every address (BRAID_BIND_ADDR=0.0.0.0) published
    // 0.0.0.0, where a peer on another host connected to itself: the
    // address that reaches the store's host is published instead.
    if (!impl.one_host && runtime::is_wildcard_address(options.bind_addr)) {
      // Where the store's host is this one by a loopback name (Debian's
      // 127.0.1.1 for its own host name), no route says which address the
      // other hosts reach: refused, naming the remedy, rather than
      // published as the wildcard (a review helper's case).
      const std::string toward = runtime::is_loopback_address(impl.info.store_host)
                                     ? impl.info.store_host
                                     : runtime::local_address_toward(impl.info.store_host, impl.info.store_port);
      if (runtime::is_loopback_address(toward))
        throw InvalidUsage("rank " + std::to_string(impl.rank) + " listens on every address (BRAID_BIND_ADDR=" +
                           options.bind_addr + ") and its communicator spans hosts, but the store's host " +
                           impl.info.store_host + " is this host by a loopback address (" + toward +
                           "), so nothing tells which address the other hosts reach: set BRAID_BIND_ADDR to this "
                           "host's address on the network they share");
      options.advertise_addr = toward;
      // 0.0.0.0 takes IPv4 alone: a route to the store over IPv6 listens
      // on :: (both families) instead, or peers met "connection refused".
      if (toward.find(':') != std::string::npos && options.bind_addr.find(':') == std::string::npos)
        options.bind_addr = "::";
    }
    options.peers = plan.use_tcp;
    impl.transports.push_back(tcp::connect_tcp(*impl.store, impl.key_prefix, options));
    add_routes(impl, plan.use_tcp);
  }
  if (any(plan.use_ib)) {
    auto options = with_common<ibverbs::IbOptions>(common);
    options.device = {config.ib_hca, config.ib_gid_index};
    options.qps = config.ib_qps_per_peer;
    options.peers = plan.use_ib;
    impl.transports.push_back(ibverbs::open_ibverbs(*impl.store, impl.key_prefix, options));
    add_routes(impl, plan.use_ib);
  }
  impl.status = std::make_unique<StatusBoard>(impl.store, impl.key_prefix, impl.rank, impl.size);
  if (!impl.one_host) {
    std::vector<std::string> names;
    for (const std::string& host : impl.hosts) names.push_back(runtime::host_name(host));
    impl.status->set_hosts(std::move(names));
  }
  spdlog::info("comm {:08x} ({}): rank {}/{} on host {}; shm to ranks {}; tcp to ranks {} ({} socket(s) each); "
               "ibverbs to ranks {}; BRAID_TRANSPORT={} ({}); ring order {}; {} rank(s) of this host on {} CPU(s) "
               "({}): waits {}",
               impl.comm_id, impl.key_prefix, impl.rank, impl.size, impl.hosts[impl.rank],
               rank_list(plan.use_shm), rank_list(plan.use_tcp), config.tcp_nsocks, rank_list(plan.use_ib), config.transport,
               plan.why, ring_order(impl.size), plan.local.size(), cpus, impl.cpus[impl.rank],
               oversubscribed ? "yield and sleep (oversubscribed)"
                              : "spin up to BRAID_SPIN_US=" + std::to_string(config.spin_us) + " us, then sleep");
}

}  // namespace

void connect_transports(Communicator::Impl& impl) {
  impl.one_host = std::all_of(impl.hosts.begin(), impl.hosts.end(),
                              [&](const std::string& h) { return h == impl.hosts.front(); });
  impl.exchange.routes.assign(static_cast<std::size_t>(impl.size), nullptr);
  Plan plan = plan_transports(impl);
  agree_on_resources(impl, plan);
  try {
    connect_planned(impl, plan);
  } catch (...) {
    fail_setup(impl);
  }
}

// braid-launch says when a rank exited with status 0 while the job ran on
// (runtime::job_exited_key): one that returned before creating this
// communicator never comes, and its peers waited for it until
// BRAID_TIMEOUT.
// The keys name the launcher's ranks and its world size: a world a
// program forms of some of them, numbered its own way, reads none (it
// would blame a live rank for another that returned).
static void throw_if_exited(Communicator::Impl& impl, int peer, std::chrono::steady_clock::time_point deadline) {
  std::optional<runtime::Bytes> exited;
  try {
    exited = impl.store->try_get(runtime::job_exited_key(impl.info.world_size, peer), deadline);
  } catch (const Error&) {
  }
  if (!exited) return;
  throw RemoteError("rank " + std::to_string(impl.rank) + " cannot create communicator " + impl.key_prefix + ": rank " +
                        std::to_string(peer) + " will not join it: braid-launch reports " + std::string(exited->begin(), exited->end()) +
                        " while the job ran on (every rank must create each communicator of the job)",
                    peer);
}

// A peer's host key, waited for in slices: between them, a failure another
// rank published (a foreign world size, a duplicate rank) ends the wait.
// Ranks told a world larger than the job's waited for ranks that never come
// until BRAID_TIMEOUT, while their peers had already found the cause.
// The slices grow from 200 ms to 2 s, so that ranks waiting long for a
// slow peer (a large job starting) ask the store once every 2 s, not 5 times
// a second each. The wait ends at the deadline however the store behaves: a
// store that stopped answering (its rank frozen) held each slice a second
// past its end, the look for an exited rank until the deadline, and then
// another slice and a 2 s last look ran past it, 2x BRAID_TIMEOUT in all at
// 3 s (tests/comm/test_failures_api.cc).
static std::string host_of_peer(Communicator::Impl& impl, const std::string& key) {
  using namespace std::chrono;
  constexpr milliseconds kLongestSlice{2000};
  constexpr milliseconds kLastLook{1000};
  milliseconds slice{200};
  const auto deadline = steady_clock::now() + impl.timeout;
  for (;; slice = std::min(slice * 2, kLongestSlice)) {
    const auto left = duration_cast<milliseconds>(deadline - steady_clock::now());
    try {
      return impl.store->get_string(key, std::clamp(left, milliseconds{1}, slice));
    } catch (const TimeoutError&) {
      // A slice held well past the deadline went unanswered: the store
      // stopped, and the error says so; a last look would only add to it.
      if (steady_clock::now() > deadline + kLastLook / 4) throw;
      throw_if_exited(impl, std::stoi(key.substr(key.rfind('/') + 1)), deadline);
      if (left <= slice || steady_clock::now() >= deadline) {
        // The last look: a store that no longer answers is named by its own
        // TimeoutError, not taken for a rank that never joined.
        if (std::optional<runtime::Bytes> value = impl.store->try_get(key, steady_clock::now() + kLastLook))
          return std::string(value->begin(), value->end());
        throw TimeoutError("key '" + key + "' did not appear in the store within " +
                           std::to_string(impl.timeout.count()) + " ms (" + impl.config.timeout_name + "): rank " +
                           key.substr(key.rfind('/') + 1) + " has not joined communicator " + impl.key_prefix +
                           (impl.info.launcher.starts_with("torch.distributed")
                                ? "; it may have failed, not started, or not reached this init_process_group or "
                                  "new_group yet"
                                : "; it may have failed, not started, or been told another --nproc-per-node") +
                           (impl.info.launcher == "braid-launch" || impl.info.launcher.starts_with("torch.distributed")
                                ? std::string()
                                : ", or joined another job's store (jobs started on one port " +
                                      started(impl.info) + " with no job id need a BRAID_JOB_TOKEN each)"));
      }
    }
    throw_if_peer_failed(impl, deadline);
  }
}

// Every rank publishes its host identity and its CPU affinity in one key
// ("<host>\n<cpus>": a host identity holds no newline); all read
// everyone's.
static void exchange_hosts(Communicator::Impl& impl, int size, const runtime::Config& config) {
  const std::string host = runtime::local_host_id(config), cpus = runtime::allowed_cpus();
  impl.hosts.assign(static_cast<std::size_t>(size), host);
  impl.cpus.assign(static_cast<std::size_t>(size), cpus);
  if (!impl.store || size == 1) return;
  // Two processes with one rank number, or ranks told different world
  // sizes (nodes started with different --nproc-per-node): each waited for
  // ranks that never came until BRAID_TIMEOUT, naming a store key. A rank
  // that meets either says so at once.
  const std::string me = std::to_string(impl.rank), ranks = std::to_string(size);
  // What to do about it: one --node-rank for two nodes gives two processes
  // one rank; nodes numbered in join order (no --node-rank) cannot.
  const auto where = [&](const std::string& remedy) {
    return " (this one: rank " + me + " of " + ranks + ", " + runtime::describe(impl.info) + "); " + remedy;
  };
  // The cause is published as well: ranks that meet neither wait for it.
  const auto refuse = [&](const std::string& why) {
    publish_failure(impl, Stage::connect, why);
    return InvalidUsage(why);
  };
  // Under other launchers the likelier cause is a second job on the same
  // port whose token, derived from what the launchers give, is the same.
  if (impl.store->add(impl.key_prefix + "/claims/" + me, 1) > 1)
    throw refuse("two processes of this job were given rank " + me +
                 where(impl.info.launcher == "braid-launch"
                           ? "every node must be started with a --node-rank of its own (or none: nodes then take "
                             "their ranks in the order they join) and the same --nproc-per-node"
                           : "another job started on the same store address " + started(impl.info) +
                                 " with no job id of its own (so the same job token) may have joined this job's "
                                 "store: give each job its own BRAID_JOB_TOKEN or port"));
  // BRAID_TRANSPORT as well: ranks told different ones planned different
  // transports for one pair and waited for each other's keys until
  // BRAID_TIMEOUT, naming neither the variable nor the peer.
  const std::string key = impl.key_prefix + "/host/";
  impl.store->set(key + me, host + "\n" + cpus + "\n" + ranks + "\n" + config.transport);
  for (int r = 0; r < size; ++r) {
    if (r == impl.rank) continue;
    std::vector<std::string> lines;  // host, cpus, world size, transport
    std::istringstream value(host_of_peer(impl, key + std::to_string(r)));
    for (std::string line; std::getline(value, line);) lines.push_back(line);
    lines.resize(4);
    impl.hosts[r] = lines[0];
    impl.cpus[r] = lines[1];
    if (lines[2] != ranks)
      throw refuse("rank " + std::to_string(r) + " of this job was started in a world of " + lines[2] +
                   " ranks, this one in a world of " + ranks +
                   where("every node must be started with the same --nproc-per-node (and --nnodes)"));
    if (lines[3] != config.transport)
      throw refuse("rank " + std::to_string(r) + " was started with BRAID_TRANSPORT=" + lines[3] +
                   ", this one (rank " + me + ") with BRAID_TRANSPORT=" + config.transport +
                   "; ranks that pick different transports for one pair wait for each other: set it alike on "
                   "every node (auto picks shm within a host and ibverbs or tcp across hosts by itself)");
  }
}

// Every communicator left ~450 bytes of keys in the store for good (its
// ranks' addresses, names, votes and status), so a job that split ~150k
// times filled a store of 64 MiB. Each rank counts itself out; the last
// removes <prefix>/..., sparing <prefix>/split...: a split may outlive its
// parent, and removes its own. A rank that never gets here (it died, or was
// forked) leaves the keys where they are: nothing is removed while a peer
// may still read them; nor does one whose set-up failed here (ranks of
// another world size, or a second process with one rank number, counted
// themselves out and removed the failure that the ranks still in set-up
// were polling for), nor one that failed later (its peers may
// never leave, and the store may be what failed: its destructor must not
// wait for it). Bounded by a short budget so that a store that no longer
// answers cannot hold up a destructor; a bounded call that gives up waiting
// for the answer closes the connection, as any late answer does, and the
// next request (the parent's, sharing it) opens another.
void forget_store_keys(Communicator::Impl& impl) noexcept {
  constexpr std::chrono::milliseconds kBudget{2000};
  if (!impl.store || !impl.set_up || impl.failure) return;
  const auto deadline =
      std::chrono::steady_clock::now() + std::min(kBudget, impl.store->request_timeout());
  try {
    if (impl.store->add(impl.key_prefix + "/left", 1, deadline) < impl.size) return;
    const std::size_t removed =
        impl.store->remove_prefix(impl.key_prefix + "/", {impl.key_prefix + "/split"}, deadline);
    spdlog::debug("comm {:08x} ({}): removed its {} keys from the store", impl.comm_id, impl.key_prefix, removed);
  } catch (const std::exception& e) {
    spdlog::debug("comm {:08x} ({}): its keys stay in the store: {}", impl.comm_id, impl.key_prefix, e.what());
  }
}

// Set-up failed on this rank. Where this rank serves the job's store (rank
// 0 without a launcher), the store goes when its process exits, and a peer
// still reading a key it needed to fail named only "the store ... closed
// the connection", not the cause: 3 runs in 12 of two ranks started with
// different BRAID_TRANSPORTs (h46's F2). Each rank marks that it failed too
// (<prefix>/setup/gone/<rank>); the serving rank waits for every peer that
// joined (in a world: claimed its rank) to have done so, 3 s at most, before
// it fails in turn: a peer learns of a published failure within 2 s
// (host_of_peer's longest slice).
// A peer's mark is bounded by 300 ms: a store that stopped answering (its
// rank frozen) would hold it to the deadline, after the wait that failed.
static void leave_failed_setup(Communicator::Impl& impl) noexcept {
  using namespace std::chrono;
  if (!impl.store || impl.size == 1) return;
  const std::string gone = impl.key_prefix + "/setup/gone/";
  try {
    if (!impl.store_server) {
      impl.store->set(gone + std::to_string(impl.rank), "1", steady_clock::now() + milliseconds{300});
      return;
    }
    const auto deadline = steady_clock::now() + std::min<milliseconds>(impl.timeout, seconds(3));
    const bool world = impl.world_ranks.empty();
    std::vector<std::string> peers;
    for (int r = 0; r < impl.size; ++r)
      if (r != impl.rank &&
          (!world || impl.store->try_get(impl.key_prefix + "/claims/" + std::to_string(r), deadline)))
        peers.push_back(gone + std::to_string(r));
    const auto left = duration_cast<milliseconds>(deadline - steady_clock::now());
    if (!peers.empty() && left > milliseconds{0}) impl.store->wait(peers, left);
  } catch (const std::exception& e) {
    spdlog::debug("comm {:08x} ({}): did not see every peer fail set-up too: {}", impl.comm_id, impl.key_prefix,
                  e.what());
  }
}

std::unique_ptr<Communicator> Communicator::create_world() {
  return create_world(runtime::rank_info_from_env());
}

std::unique_ptr<Communicator> Communicator::create_world(const runtime::RankInfo& info) {
  return create_world(info, runtime::config());
}

std::unique_ptr<Communicator> Communicator::create_world(const runtime::RankInfo& info,
                                                         const runtime::Config& config) {
  runtime::validate(info);
  runtime::validate(config);
  runtime::setup_logging(info.rank, config.log_level);
  auto impl = new_impl(info, config, next_world_prefix(info), info.rank, info.world_size);
  if (info.world_size > 1 || info.launcher != "none") {
    // On the first free port of the job's sequence, found by the others
    // through the token (runtime/store_ports.h).
    impl->store_server = job_store_server(info);
    impl->store = runtime::connect_job_store(info, impl->store_server.get(), config.timeout);
    impl->store->set_request_timeout(config.timeout);
  }
  // Only when it is logged: describe_placement() loads hwloc's whole
  // topology, tens of ms of every torch new_group at the default level.
  if (spdlog::should_log(spdlog::level::info))
    spdlog::info("{}; {}", runtime::describe(info), runtime::describe_placement());
  try {
    exchange_hosts(*impl, info.world_size, config);
    connect_transports(*impl);
  } catch (...) {
    leave_failed_setup(*impl);
    throw;
  }
  impl->set_up = true;
  return std::unique_ptr<Communicator>(new Communicator(std::move(impl)));
}

std::unique_ptr<Communicator> Communicator::split(int color, int key) {
  const int n = impl_->size;
  std::int64_t mine[2] = {color, key};
  std::vector<std::int64_t> all(2 * static_cast<std::size_t>(n));
  Op exchange;  // an all_gather marked as split's (kSplitRoot)
  exchange.kind = OpKind::all_gather;
  exchange.send = mine;
  exchange.recv = all.data();
  exchange.count = 2;
  exchange.dtype = DataType::i64;
  exchange.root = kSplitRoot;
  submit(std::move(exchange)).wait();
  int split_index = impl_->split_count++;
  if (color < 0) return nullptr;
  std::vector<std::pair<std::int64_t, int>> members;  // (key, parent rank)
  for (int r = 0; r < n; ++r)
    if (all[2 * r] == color) members.emplace_back(all[2 * r + 1], r);
  std::sort(members.begin(), members.end());
  int new_rank = static_cast<int>(std::find(members.begin(), members.end(), std::make_pair<std::int64_t, int>(key, rank())) -
                                  members.begin());
  auto prefix = impl_->key_prefix + "/split" + std::to_string(split_index) + "/color" + std::to_string(color);
  auto impl = new_impl(impl_->info, impl_->config, prefix, new_rank, static_cast<int>(members.size()));
  impl->store = impl_->store;
  // Where rank 0 of the world serves the store (no launcher), its children
  // keep it up: the world destroyed first took the store of every child
  // with it, and their next split or status failed.
  impl->store_server = impl_->store_server;
  std::string ranks, world;
  for (const auto& member : members) {
    impl->hosts.push_back(impl_->hosts[member.second]);
    impl->cpus.push_back(impl_->cpus[member.second]);
    const int in_world = impl_->world_ranks.empty() ? member.second : impl_->world_ranks[member.second];
    impl->world_ranks.push_back(in_world);
    ranks += (ranks.empty() ? "" : ", ") + std::to_string(impl->world_ranks.size() - 1);
    world += (world.empty() ? "" : ", ") + std::to_string(in_world);
  }
  impl->scope_note = "; on communicator " + prefix + ", whose ranks " + ranks + " are world ranks " + world;
  try {
    connect_transports(*impl);
  } catch (...) {
    leave_failed_setup(*impl);
    throw;
  }
  impl->set_up = true;
  return std::unique_ptr<Communicator>(new Communicator(std::move(impl)));
}

}  // namespace braid::comm
