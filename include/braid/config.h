// All BRAID_* settings, read once from the environment into one typed struct.
//
// Every field documents its variable, its default and its allowed values; the
// README's configuration table is generated from the same facts and must
// match. Nothing else in braid calls getenv() for a BRAID_* setting (rank
// identity, which the launcher sets, lives in runtime/rank_info.h).
#pragma once

#include <chrono>
#include <cstddef>
#include <string>

namespace braid::runtime {

struct Config {
  // BRAID_LOG_LEVEL: trace|debug|info|warn|error|off. Default warn.
  std::string log_level = "warn";
  // BRAID_TIMEOUT: seconds any single wait may take before it fails with a
  // TimeoutError (collectives, store requests, connection set-up). Default 300.
  std::chrono::milliseconds timeout{300'000};
  // What timeout messages call `timeout`: "BRAID_TIMEOUT", or for a torch
  // process group "the process group's timeout" (the torch backend sets it).
  std::string timeout_name = "BRAID_TIMEOUT";
  // BRAID_BIND_ADDR: the only address braid listens on. Default 127.0.0.1.
  std::string bind_addr = "127.0.0.1";
  // BRAID_TRANSPORT: auto|tcp|shm|ibverbs. Which transport carries peer
  // traffic. ibverbs forces RDMA for every peer and is refused in a build
  // without libibverbs or when no verbs device is usable.
  std::string transport = "auto";
  // BRAID_IB_HCA: name[:port] of the verbs device (and port) to use, e.g.
  // mlx5_0:1 or rxe0. Default: chosen from the GID tables (the ibverbs
  // transport logs its choice and why).
  std::string ib_hca;
  // BRAID_IB_GID_INDEX: GID index on that port, 0..255; -1 (default) picks
  // RoCE v2 with an IPv4-mapped address, then a global IPv6, then link-local.
  int ib_gid_index = -1;
  // BRAID_IB_QPS_PER_PEER: reliable-connected queue pairs per peer, 1..8;
  // large messages are written directly in stripes over them.
  int ib_qps_per_peer = 1;
  // BRAID_ALGO: auto|ring|recursive_doubling|binomial|pipelined|oneshot|
  // direct. Forces the algorithm where the collective has it (all_reduce:
  // ring or recursive_doubling; broadcast: binomial or pipelined; oneshot:
  // the shared slots of a one-host shm communicator, where the call fits
  // one; direct: the direct collective on registered host buffers of one
  // host). Default auto (comm/algorithms/select.cc).
  std::string algo = "auto";
  // BRAID_DIRECT_WORKERS: auto|all|one. Which ranks do a direct
  // collective's work (comm/algorithms/direct.h): `all`, each rank its own
  // share; `one`, rank 0 every rank's share, the same steps (so the same
  // results, bit for bit), while the others wait for it; `auto` (default),
  // one where every rank's buffers are on the same GPU, where the ranks'
  // processes take the GPU in turns and each share costs a context switch,
  // all otherwise (and under MPS, where they do not). The ranks agree in
  // each call: one where none asks for all and every one asks for one or is
  // auto on a shared GPU.
  std::string direct_workers = "auto";
  // BRAID_TCP_NSOCKS: sockets per peer connection, 1..16. Default 4: several
  // streams move large messages faster, even over loopback.
  int tcp_nsocks = 4;
  // BRAID_SOCKET_BUFFER_BYTES: SO_SNDBUF/SO_RCVBUF per socket. Default 4 MiB.
  std::size_t socket_buffer_bytes = 4u << 20;
  // BRAID_SEGMENT_BYTES: bytes per transport operation when a chunk is cut
  // into segments to pipeline I/O with reduction. Default 256 KiB.
  std::size_t segment_bytes = 256u << 10;
  // BRAID_CHUNK_BYTES: a large ring all-reduce runs in rounds in which each
  // rank owns a chunk of this size, so that the reduced chunk is sent on
  // while it is still in cache; 0 runs the whole message as one round.
  std::size_t chunk_bytes = 1u << 20;
  // BRAID_STREAM_BYTES: out-of-place ring all-reduces of at least this many
  // bytes write their output with non-temporal stores (from cache-resident
  // staging), sparing the read-for-ownership of memory that is only
  // overwritten. Default 4 MiB; 0 = never.
  std::size_t stream_bytes = 4u << 20;
  // BRAID_INLINE_BYTES: operations of at most this many bytes run in the
  // calling thread when the communicator is idle (lower latency); larger
  // ones run on the communicator's progress thread. Default 64 KiB.
  std::size_t inline_bytes = 64u << 10;
  // BRAID_HOST_ID: overrides the host identity used for topology. Default:
  // the machine's hostname plus boot id.
  std::string host_id;
  // BRAID_SHM_RING_BYTES: bytes of each shared-memory channel (one per
  // ordered pair of local ranks), rounded up to a power of two. Default 4 MiB.
  std::size_t shm_ring_bytes = 4u << 20;
  // BRAID_SHM_HOST_BYTES: bytes all shared-memory rings of one host may take
  // together, 1 MiB..1 TiB. Default 1 GiB. The L x (L-1) rings of L local
  // ranks halve their size (never below 64 KiB) until they fit.
  std::size_t shm_host_bytes = 1u << 30;
  // BRAID_SPIN_US: microseconds a waiting rank polls (shm doorbell, TCP
  // sockets) before it sleeps in futex / ppoll, 0..10000. Default 20; no
  // spinning when the host has more local ranks than cores.
  int spin_us = 20;
  // BRAID_CUDA_GATE: auto|kernel|wait|host|event|flag. How a CUDA stream waits
  // for a collective on device memory: `kernel`, a one-thread kernel that
  // gives up after BRAID_TIMEOUT + 10 s; `wait`, cuStreamWaitValue64 in the
  // GPU's front end, opened by a host thread past the same limit (no kernel
  // stays resident); `host`, not at all: the call returns once the
  // collective has run (its result's copy back queued), so nothing of this
  // process waits on the GPU meanwhile and ranks sharing a GPU need not
  // time-slice it; `event`, as `host` for staged calls, but a direct
  // collective returns once every rank's kernels are queued, the streams
  // waiting for each other's CUDA IPC events (no host waits for the GPU);
  // `flag`, as `event`, but the collective's kernels run on the caller's
  // stream between one-thread kernels that wait for flags the other ranks
  // set in device memory (no event between processes; for MPS);
  // `auto` (default), `kernel` until a direct collective finds another
  // rank's buffers on this rank's GPU, from then on `flag` under MPS and
  // `host` without (comm/device.h).
  std::string cuda_gate = "auto";
  // BRAID_STORE_MAX_BYTES: bytes of keys and values the rendezvous store
  // holds for one job, 1 MiB..1 TiB. Default 64 MiB; braid itself keeps a
  // few hundred bytes per rank there (addresses, shared-memory names,
  // status). A set past it fails with an error naming this variable.
  std::size_t store_max_bytes = 64u << 20;
};

// Parses the environment; throws InvalidUsage naming the variable on a bad
// value. The first call reads, later calls return the same object.
const Config& config();
// Parses the environment now, as config() did on its first call.
Config read_config();
// Throws InvalidUsage naming the field (and its variable) that holds a
// value the code cannot run with: read_config()'s ranges, except that code
// may leave algo empty (auto, keeping small calls off the shared slots) and
// make rings down to 4 KiB. For a Config made or changed in code
// (Communicator::create_world(info, config) checks its argument).
void validate(const Config& config);

// Parses a byte count with an optional K/M/G (binary) suffix: "64M", "4096".
std::size_t parse_bytes(const std::string& text);

}  // namespace braid::runtime
