#include "tools/bench/bench.h"

#include <nlohmann/json.hpp>

#include <sys/mman.h>
#include <sys/stat.h>

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <utility>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <sstream>
#include <vector>

#include "comm/algorithms/algorithms.h"
#include "comm/communicator.h"
#include "tools/bench/device.h"
#include "tools/bench/verify.h"
#include "runtime/atomic_file.h"
#include "runtime/config.h"
#include "runtime/errors.h"
#include "runtime/memory_limits.h"
#include "runtime/rank_info.h"

namespace braid::comm {
namespace {

// Benchmark buffers: 2 MiB aligned and advised for transparent huge pages,
// as a training framework's caching allocator would hand them out, so that
// TLB misses do not decide large-message results. The memcpy baseline uses
// the same buffers.
// With --registered, from Communicator::allocate instead (memory the local
// ranks map into each other), as nccl-tests' -R registers its buffers.
struct HugeBuffer {
  std::byte* data = nullptr;
  std::size_t bytes = 0;
  bool shared = false;
  HugeBuffer() = default;
  explicit HugeBuffer(std::size_t n, std::byte fill, bool registered = false) : bytes(n), shared(registered) {
    constexpr std::size_t kHuge = 2u << 20;
    std::size_t rounded = (std::max<std::size_t>(n, 1) + kHuge - 1) / kHuge * kHuge;
    data = static_cast<std::byte*>(shared ? Communicator::allocate(rounded) : std::aligned_alloc(kHuge, rounded));
    if (!data) throw SystemError("out of memory allocating " + std::to_string(n) + " bytes");
    if (!shared) madvise(data, rounded, MADV_HUGEPAGE);
    std::memset(data, static_cast<int>(fill), rounded);
  }
  HugeBuffer(HugeBuffer&& o) noexcept
      : data(std::exchange(o.data, nullptr)), bytes(o.bytes), shared(o.shared) {}
  HugeBuffer& operator=(HugeBuffer&& o) noexcept {
    free_data();
    data = std::exchange(o.data, nullptr);
    bytes = o.bytes;
    shared = o.shared;
    return *this;
  }
  ~HugeBuffer() { free_data(); }
  void free_data() {
    if (data && shared) Communicator::deallocate(data);
    else std::free(data);
    data = nullptr;
  }
};


using Seconds = std::chrono::duration<double>;

struct Case {
  std::size_t count = 0;        // the per-call count argument
  std::size_t send_elems = 0, recv_elems = 0;
  double bus_factor = 1.0;
};

Case make_case(const std::string& coll, std::size_t bytes, std::size_t es, int n) {
  Case c;
  std::size_t elems = bytes / es;
  double nn = n;
  if (coll == "all_reduce") {
    c = {elems, elems, elems, 2 * (nn - 1) / nn};
  } else if (coll == "reduce_scatter" || coll == "all_gather" || coll == "all_to_all") {
    std::size_t per = elems / n;
    c.count = per;
    c.send_elems = coll == "all_gather" ? per : per * n;
    c.recv_elems = coll == "reduce_scatter" ? per : per * n;
    c.bus_factor = (nn - 1) / nn;
  } else {
    c = {elems, elems, elems, 1.0};
  }
  return c;
}

// The OpKind of a --coll name (send_recv: the send side).
OpKind kind_of(const std::string& collective) {
  static const std::pair<const char*, OpKind> kKinds[] = {
      {"all_reduce", OpKind::all_reduce}, {"reduce_scatter", OpKind::reduce_scatter},
      {"all_gather", OpKind::all_gather}, {"broadcast", OpKind::broadcast},
      {"reduce", OpKind::reduce},         {"all_to_all", OpKind::all_to_all},
      {"send_recv", OpKind::send}};
  for (const auto& [text, kind] : kKinds)
    if (collective == text) return kind;
  return OpKind::barrier;
}

class Runner {
 public:
  Runner(Communicator& comm, const BenchOptions& o)
      : comm_(comm), o_(o), es_(dtype_bytes(o.dtype)), kind_(kind_of(o.collective)) {}

  ~Runner() { release_device(); }
  OpKind kind() const { return kind_; }
  const BenchOptions& options() const { return o_; }
  Runner(const Runner&) = delete;
  Runner& operator=(const Runner&) = delete;

  // The receive buffer also holds the in-place input, which for
  // reduce_scatter is the whole send-sized vector (count x ranks elements,
  // the result landing at this rank's slice), so it takes the larger size.
  void prepare(const Case& c) {
    c_ = c;
    const std::size_t recv_elems = std::max(c.send_elems, c.recv_elems);
    send_ = HugeBuffer(std::max<std::size_t>(1, c.send_elems) * es_, std::byte{0}, o_.registered);
    recv_ = HugeBuffer(std::max<std::size_t>(1, recv_elems) * es_, std::byte{0}, o_.registered);
    if (o_.cuda) {
      release_device();
      device_send_ = bench_device::allocate(send_.bytes);
      device_recv_ = bench_device::allocate(recv_.bytes);
    }
  }

  // Fills the input (in place: inside the receive buffer where NCCL puts it),
  // the rest of the receive buffer with a marker no result holds: an
  // in-place all_gather that wrote nothing passed the check on the
  // out-of-place run's results left there. With --device cuda the host
  // buffers mirror the device ones.
  void fill(bool in_place) {
    std::memset(recv_.data, kMarker, recv_.bytes);
    table().fill_input(input(in_place, send_.data, recv_.data), c_.send_elems, comm_.rank());
    if (o_.cuda) {
      bench_device::upload(device_send_, send_.data, send_.bytes);
      bench_device::upload(device_recv_, recv_.data, recv_.bytes);
    }
  }

  std::byte* input(bool in_place, std::byte* send, std::byte* recv) {
    if (!in_place) return send;
    if (kind_ == OpKind::all_gather) return recv + comm_.rank() * c_.count * es_;
    return recv;
  }

  Work issue(bool in_place) {
    std::byte* send = o_.cuda ? device_send_ : send_.data;
    std::byte* out = o_.cuda ? device_recv_ : recv_.data;
    std::byte* in = input(in_place, send, out);
    const Stream stream{o_.cuda && !o_.null_stream ? bench_device::stream() : nullptr};
    int n = comm_.size(), r = comm_.rank();
    // The kind was parsed once: the timed loop compares no strings.
    switch (kind_) {
      case OpKind::all_reduce: return comm_.all_reduce(in, out, c_.count, o_.dtype, o_.op, stream);
      case OpKind::reduce_scatter:
        return comm_.reduce_scatter(in, in_place ? in + r * c_.count * es_ : out, c_.count, o_.dtype, o_.op, stream);
      case OpKind::all_gather: return comm_.all_gather(in, out, c_.count, o_.dtype, stream);
      case OpKind::broadcast: return comm_.broadcast(in, out, c_.count, o_.dtype, o_.root, stream);
      case OpKind::reduce: return comm_.reduce(in, out, c_.count, o_.dtype, o_.op, o_.root, stream);
      case OpKind::all_to_all: return comm_.all_to_all(in, out, c_.count, o_.dtype, stream);
      default: break;
    }
    // send_recv: a ring shift; even ranks send first so the chain never closes into a cycle.
    int to = (r + 1) % n, from = (r - 1 + n) % n;
    if (r % 2 == 0) {
      comm_.send(in, c_.count, o_.dtype, to, stream);
      return comm_.recv(out, c_.count, o_.dtype, from, stream);
    }
    comm_.recv(out, c_.count, o_.dtype, from, stream);
    return comm_.send(in, c_.count, o_.dtype, to, stream);
  }

  // Number of wrong output elements on this rank.
  std::size_t count_wrong(bool in_place) {
    const std::string& coll = o_.collective;
    int n = comm_.size(), r = comm_.rank();
    std::size_t wrong = 0;
    if (o_.cuda) bench_device::download(recv_.data, device_recv_, recv_.bytes);
    const std::byte* out = coll == "reduce_scatter" && in_place ? recv_.data + r * c_.count * es_ : recv_.data;
    std::size_t elems = coll == "reduce_scatter" ? c_.count : c_.recv_elems;
    const verify::ExpectedTable& table = this->table();
    // Out of place, the send buffer still holds the input.
    auto send_wrong = [&] {
      if (o_.cuda) bench_device::download(send_.data, device_send_, send_.bytes);
      std::size_t changed = 0;
      for (std::size_t i = 0; i < c_.send_elems; ++i)
        if (std::memcmp(table.input(r, i), send_.data + i * es_, es_) != 0) ++changed;
      return changed;
    };
    // A reduce has no output off its root (whose receive buffer NCCL leaves
    // to the library), but its input must stay: a non-root's send buffer
    // went unchecked (a review helper's case).
    if (coll == "reduce" && r != o_.root) return in_place ? 0 : send_wrong();
    for (std::size_t i = 0; i < elems; ++i) {
      const std::byte* expect;
      if (coll == "all_reduce" || coll == "reduce") {
        expect = table.reduction(i);
      } else if (coll == "reduce_scatter") {
        expect = table.reduction(r * c_.count + i);
      } else if (coll == "all_gather") {
        expect = table.input(int(i / c_.count), i % c_.count);
      } else if (coll == "broadcast") {
        expect = table.input(o_.root, i);
      } else if (coll == "all_to_all") {
        expect = table.input(int(i / c_.count), r * c_.count + i % c_.count);
      } else {  // send_recv
        expect = table.input((r - 1 + n) % n, i);
      }
      if (std::memcmp(expect, out + i * es_, es_) != 0) ++wrong;
    }
    if (in_place) return wrong;
    // Out of place, the call writes its output and nothing else: the
    // receive buffer past the output still holds the marker (an
    // out-of-place reduce_scatter's is sized for the in-place form), and
    // the send buffer still holds the input.
    for (std::size_t i = elems; i < recv_.bytes / es_; ++i)
      for (std::size_t b = 0; b < es_; ++b)
        if (std::to_integer<int>(out[i * es_ + b]) != kMarker) {
          ++wrong;
          break;
        }
    return wrong + send_wrong();
  }

  // Seconds per call: -n iterations of -m calls each, issued back to back
  // (or each waited for, -z); with -C until the last call was issued. On a
  // device the time ends once the stream has run the calls, as nccl-tests'
  // does (the last call's Work then waits no more).
  double time_iterations(bool in_place) {
    for (int i = 0; i < o_.warmup; ++i) issue(in_place).wait();
    comm_.barrier().wait();
    auto start = std::chrono::steady_clock::now();
    // A call from kProbeEvery calls back is tested now and then: once the
    // communicator has failed (a peer timed out), the calls issued after it
    // are each refused, and -n 100000000 went on issuing them for minutes
    // at full CPU after the error (a review helper's case).
    constexpr long kProbeEvery = 256;
    Work last, probe;
    long calls = 0;
    for (int i = 0; i < o_.iters; ++i)
      for (int k = 0; k < o_.agg_iters; ++k) {
        last = issue(in_place);
        if (o_.blocking) last.wait();
        if (++calls % kProbeEvery == 0) {
          if (probe.valid()) probe.test();  // throws the call's error
          probe = last;
        }
      }
    const auto issued = std::chrono::steady_clock::now();
    if (o_.cuda) bench_device::synchronize(o_.null_stream);
    last.wait();
    const auto end = o_.cpu_time ? issued : std::chrono::steady_clock::now();
    return Seconds(end - start).count() / (static_cast<double>(o_.iters) * o_.agg_iters);
  }

 private:
  Communicator& comm_;
  const BenchOptions& o_;
  std::size_t es_;
  OpKind kind_;  // o_.collective, parsed once
  void release_device() {
    bench_device::release(device_send_);
    bench_device::release(device_recv_);
    device_send_ = device_recv_ = nullptr;
  }

  // The inputs and results of the sweep's dtype and op over one period,
  // made once: a period holds 8191 x ranks of them (verify.h).
  const verify::ExpectedTable& table() {
    if (!table_) table_.emplace(comm_.size(), o_.dtype, o_.op);
    return *table_;
  }
  std::optional<verify::ExpectedTable> table_;

  static constexpr int kMarker = 0xa5;  // negative or past every small-integer result, in every dtype
  Case c_;
  HugeBuffer send_, recv_;
  std::byte* device_send_ = nullptr;  // --device cuda
  std::byte* device_recv_ = nullptr;
};

struct Result {
  double seconds = 0;
  std::uint64_t wrong = 0;
  AlgorithmChoice choice;
};

Result measure(Communicator& comm, Runner& runner, bool in_place, int check) {
  Result result;
  if (check) {
    runner.fill(in_place);
    runner.issue(in_place).wait();
    result.wrong = runner.count_wrong(in_place);
  }
  runner.fill(in_place);
  double seconds = runner.time_iterations(in_place);
  // What select.cc returned for the timed calls, before the bookkeeping
  // all_reduces below make calls of their own.
  const AlgorithmChoice choice = comm.last_algorithm(runner.kind());
  // -a: rank 0's time, or the mean, min or max over ranks, as nccl-tests.
  static constexpr ReduceOp kOver[] = {ReduceOp::sum, ReduceOp::avg, ReduceOp::min, ReduceOp::max};
  const int average = runner.options().average;
  double over_ranks = 0;
  std::uint64_t total_wrong = 0;
  if (average == 0) comm.broadcast(&seconds, &over_ranks, 1, DataType::f64, 0).wait();
  else comm.all_reduce(&seconds, &over_ranks, 1, DataType::f64, kOver[average]).wait();
  comm.all_reduce(&result.wrong, &total_wrong, 1, DataType::i64, ReduceOp::sum).wait();
  return {over_ranks, total_wrong, choice};
}

// The sizes of the sweep: -b, -b x factor (or -b + stepbytes), ... while at most -e. A sweep
// from 0 runs the empty call once and goes on from one element, since 0
// times the factor would stay 0 for ever.
std::vector<std::size_t> sweep_sizes(const BenchOptions& o) {
  std::vector<std::size_t> sizes;
  std::size_t bytes = o.min_bytes;
  if (bytes == 0) {  // -i steps on from 0 (0, i, 2i, ...), -f from one element
    sizes.push_back(0);
    bytes = o.step_bytes ? o.step_bytes : dtype_bytes(o.dtype);
  }
  for (; bytes <= o.max_bytes; bytes = o.step_bytes ? bytes + o.step_bytes : bytes * o.factor) {
    sizes.push_back(bytes);
    if (o.step_bytes ? bytes > o.max_bytes - o.step_bytes : bytes > o.max_bytes / o.factor)
      break;  // the next size passes -e (or overflows)
  }
  return sizes;
}

// What one rank holds at size `bytes` of the sweep: its send and receive
// buffers (HugeBuffer rounds each to 2 MiB; host ones also under --device
// cuda), the communicator's scratch, which it keeps, and for an f16/bf16 avg the
// scaled copy of the input. `peers`: the local peers whose registered
// buffers (-R 1) this rank maps into its address space.
double buffer_bytes(const BenchOptions& o, std::size_t bytes, int n, int peers = 0) {
  constexpr double kHuge = 2u << 20;
  std::size_t es = 1;
  for (DataType dtype : o.dtypes) es = std::max(es, dtype_bytes(dtype));
  const Case c = make_case(o.collective, bytes, es, n);
  auto rounded = [&](std::size_t elems) { return std::ceil(double(std::max<std::size_t>(elems, 1) * es) / kHuge) * kHuge; };
  const double send = rounded(c.send_elems), recv = rounded(std::max(c.send_elems, c.recv_elems));
  bool halves_avg = false;
  for (DataType dtype : o.dtypes)
    for (ReduceOp op : o.ops)
      halves_avg = halves_avg || ((dtype == DataType::f16 || dtype == DataType::bf16) && op == ReduceOp::avg);
  // reduce (non-root) and all_to_all (in place) use a scratch of the
  // message's size; all_reduce's recursive doubling too, which runs the
  // smaller messages (taken as up to 64 MiB; the ring's slots are small).
  const double whole = std::max(send, recv);
  const double scratch = o.collective == "reduce" || o.collective == "all_to_all" ? whole
                         : o.collective == "all_reduce"                         ? std::min(whole, 64.0 * (1 << 20))
                                                                                : 0.0;
  return send + recv + scratch + (halves_avg ? send : 0.0) + (o.registered ? peers * (send + recv) : 0.0);
}

// The largest size of the sweep whose buffers fit in what this rank may
// take under every limit (runtime::memory_limits; MemAvailable and the
// cgroup's are shared by the host's ranks, the address space is the
// rank's own, where -R 1 maps the peers' buffers too); while the next
// size's are set up, the previous size's are still held. 0 where not even
// the first size fits, and then `short_of` names the limit.
std::size_t largest_fitting(const BenchOptions& o, int n, int local_ranks,
                            const std::vector<runtime::MemoryLimit>& limits, const runtime::MemoryLimit*& short_of) {
  const std::vector<std::size_t> sizes = sweep_sizes(o);
  std::size_t fits = 0;
  std::optional<std::size_t> previous;
  for (std::size_t bytes : sizes) {
    for (const runtime::MemoryLimit& limit : limits) {
      const int peers = limit.per_host ? 0 : local_ranks - 1;
      const double need = buffer_bytes(o, bytes, n, peers) + (previous ? buffer_bytes(o, *previous, n, peers) : 0.0);
      if (need > runtime::per_rank(limit, local_ranks)) {
        short_of = &limit;
        return fits;
      }
    }
    fits = bytes;
    previous = bytes;
  }
  return fits;
}

// -e past what memory holds ran the sweep into the OOM killer (a rank
// SIGKILLed after the 256 MiB row of -e 1T; with -R 1 at the first size).
// As nccl-tests does, the sweep ends at the largest size that fits on
// every rank, which rank 0 says; where not even -b fits, the run is
// refused with the numbers.
std::size_t capped_max_bytes(Communicator& comm, const BenchOptions& o) {
  const int local_ranks = std::max(1, runtime::rank_info_from_env().local_world_size);
  const std::vector<runtime::MemoryLimit> limits = runtime::memory_limits();
  const runtime::MemoryLimit* limit = nullptr;
  const std::vector<std::size_t> sizes = sweep_sizes(o);
  const std::size_t mine = largest_fitting(o, comm.size(), local_ranks, limits, limit);
  // Per rank: the index of the largest size that fits, + 1 (0: none).
  const auto index_of = [&](std::size_t fits) -> std::int64_t {
    if (!limit) return static_cast<std::int64_t>(sizes.size());
    const auto at = std::find(sizes.begin(), sizes.end(), fits);
    return fits == 0 && (sizes.empty() || sizes.front() != 0) ? 0 : at - sizes.begin() + 1;
  };
  std::int64_t count = index_of(mine), all = 0;
  comm.all_reduce(&count, &all, 1, DataType::i64, ReduceOp::min).wait();
  if (all == static_cast<std::int64_t>(sizes.size())) return o.max_bytes;
  const std::string where =
      limit ? runtime::format_bytes(runtime::per_rank(*limit, local_ranks)) + " per rank (" + limit->source +
                  (limit->per_host && local_ranks > 1 ? ", shared by " + std::to_string(local_ranks) + " ranks" : "") + ")"
            : std::string();
  const bool here = count == all;
  const int peers = limit && !limit->per_host ? local_ranks - 1 : 0;  // what the address space holds of them
  if (all == 0)
    throw InvalidUsage("-b " + std::to_string(o.min_bytes) + " needs " +
                       runtime::format_bytes(buffer_bytes(o, std::max<std::size_t>(o.min_bytes, 1), comm.size(), peers)) +
                       " of buffers and scratch per rank, more than " + (here ? where : "another rank has") +
                       "; lower -b");
  const std::size_t lowered = sizes[static_cast<std::size_t>(all - 1)];
  if (comm.rank() == 0) {
    const std::string room = here ? where : "what another rank has";
    std::printf("# -e %zu lowered to %zu (as nccl-tests lowers maxBytes): larger sizes' buffers and scratch, %s per "
                "rank at -e, do not fit in %s\n",
                o.max_bytes, lowered, runtime::format_bytes(buffer_bytes(o, sizes.back(), comm.size(), peers)).c_str(),
                room.c_str());
  }
  return lowered;
}

// A --json or --csv file of rank 0. Checked before the sweep, so that a
// path that cannot be written stops the run at once rather than after it,
// but written only after it: opening it then emptied an earlier run's
// results, and a run refused (-b too large) or killed left them at 0 bytes
// (a review helper's case). A regular file, or a new one, is written beside
// it and renamed over it, so a write that fails (a full disk) leaves it as
// it was; anything else (/dev/stdout, a pipe) is opened at once and
// written through. Every failure throws a SystemError naming the flag,
// the path and the cause.
class OutputFile {
 public:
  OutputFile(const char* flag, const std::string& path) : flag_(flag), path_(path) {
    if (path.empty()) return;
    struct stat st {};
    const bool there = ::stat(path.c_str(), &st) == 0;
    if (there && S_ISDIR(st.st_mode)) fail("cannot open", EISDIR);
    if (there && !S_ISREG(st.st_mode)) {
      file_ = std::fopen(path.c_str(), "w");
      if (!file_) fail("cannot open", errno);
      return;
    }
    std::error_code ec;
    // Where AtomicFile will write: through a link, its target's directory.
    const std::filesystem::path target = there ? std::filesystem::canonical(path, ec) : std::filesystem::path(path);
    if (ec) fail("cannot open", ec.value());
    std::string dir = target.parent_path().string();
    if (dir.empty()) dir = ".";
    if (::access(dir.c_str(), W_OK | X_OK) != 0 || (there && ::access(target.c_str(), W_OK) != 0))
      fail("cannot open", errno);
    staged_ = true;
  }
  ~OutputFile() {
    if (file_) std::fclose(file_);
  }
  OutputFile(const OutputFile&) = delete;
  OutputFile& operator=(const OutputFile&) = delete;

  void write_and_close(const std::string& text) {
    if (file_) {
      std::FILE* file = std::exchange(file_, nullptr);
      bool written = std::fwrite(text.data(), 1, text.size(), file) == text.size() && std::fflush(file) == 0;
      int err = errno;
      if (std::fclose(file) != 0 && written) {
        written = false;
        err = errno;
      }
      if (!written) fail("could not write", err);
      return;
    }
    if (!std::exchange(staged_, false)) return;
    try {
      AtomicFile file(path_);  // keeps the replaced file's permissions and a link
      file.write(text.data(), text.size());
      file.commit();
    } catch (const Error& e) {
      throw SystemError("could not write the " + std::string(flag_) + " file '" + path_ + "': " + e.what() +
                        "; give a path in an existing, writable directory on a file system with space");
    }
  }

 private:
  [[noreturn]] void fail(const char* what, int err) const {
    throw SystemError(errno_message(std::string(what) + " the " + flag_ + " file '" + path_ + "'", err) +
                      "; give a path in an existing, writable directory on a file system with space");
  }
  const char* flag_;
  std::string path_;
  bool staged_ = false;  // a regular file (or a new one), written by AtomicFile at the end
  std::FILE* file_ = nullptr;
};

// Every column of every row, the memcpy baseline and select.cc's reason included.
std::string csv_text(const nlohmann::json& rows) {
  std::ostringstream csv;
  csv << "collective,bytes,count,dtype,op,root,ranks,transport,algorithm,algorithm_reason,"
         "oop_time_us,oop_algbw_gbps,oop_busbw_gbps,oop_busbw_per_memcpy,oop_wrong,"
         "ip_time_us,ip_algbw_gbps,ip_busbw_gbps,ip_busbw_per_memcpy,ip_wrong,memcpy_gbps\n";
  // A group not measured (null) or a count not checked: empty fields.
  auto field = [&](const nlohmann::json& value) {
    if (!value.is_null()) csv << value;
    csv << ',';
  };
  auto group = [&](const nlohmann::json& g) {
    for (const char* key : {"time_us", "algbw_gbps", "busbw_gbps", "busbw_per_memcpy", "wrong"})
      field(g.is_null() ? g : g[key]);
  };
  for (auto& row : rows) {
    csv << row["collective"].get<std::string>() << ',' << row["bytes"] << ',' << row["count"] << ','
        << row["dtype"].get<std::string>() << ',' << row["op"].get<std::string>() << ',' << row["root"] << ','
        << row["ranks"] << ',' << row["transport"].get<std::string>() << ','
        << row["algorithm"].get<std::string>() << ",\"" << row["algorithm_reason"].get<std::string>() << "\",";
    group(row["out_of_place"]);
    group(row["in_place"]);
    if (!row["memcpy_gbps"].is_null()) csv << row["memcpy_gbps"];
    csv << '\n';
  }
  return csv.str();
}

// The table's preamble and column heads, as nccl-tests prints them.
void print_header(Communicator& comm, const BenchOptions& o, double memcpy_gbps) {
  const int n = comm.size();
  const bool reduces = o.collective == "all_reduce" || o.collective == "reduce_scatter" || o.collective == "reduce";
  std::printf("# braid-bench %s: %d ranks, transport %s, dtype %s, op %s, iters %d, warmup %d, check %d\n",
              o.collective.c_str(), n, comm.transport_summary().c_str(), std::string(name(o.dtype)).c_str(),
              reduces ? std::string(name(o.op)).c_str() : "none", o.iters, o.warmup, o.check);
  if (memcpy_gbps <= 0) {
    std::printf("# %s: no memcpy baseline measured (--memcpy_bytes 0): /mcpy reads N/A\n",
                o.cuda ? "buffers in GPU memory" : "buffers in host memory");
  } else if (o.cuda) {
    std::printf("# buffers in GPU memory; device-to-device cudaMemcpy bandwidth: %.2f GB/s (busbw/memcpy below "
                "is relative to it)\n", memcpy_gbps);
  } else {
    std::printf("# single-core memcpy bandwidth: %.2f GB/s (busbw/memcpy below is relative to it)\n", memcpy_gbps);
  }
  if (o.registered) std::printf("# buffers from Communicator::allocate (registered, mapped by the local ranks)\n");
  std::printf("#\n#%12s %12s %6s %6s %5s %-26s %-42s %s\n", "", "", "", "", "", "", "                 out-of-place",
              "                in-place");
  // -C 1: the times are until the calls were issued, labelled as nccl-tests does.
  const char* time = o.cpu_time ? "cputime" : "time";
  std::printf("#%12s %12s %6s %6s %5s %-26s %10s %8s %8s %6s %7s %10s %8s %8s %6s %7s\n", "size", "count",
              "type", "redop", "root", "transport:algorithm", time, "algbw", "busbw", "/mcpy", "#wrong", time, "algbw",
              "busbw", "/mcpy", "#wrong");
  std::printf("#%12s %12s %6s %6s %5s %-26s %10s %8s %8s %6s %7s %10s %8s %8s %6s %7s\n", "(B)", "(elements)", "",
              "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "", "(us)", "(GB/s)", "(GB/s)", "", "");
}

// Rank 0 opens the output files; every rank learns whether that worked, so
// a bad path ends every rank at once. Returns false on every rank when it
// did not; rank 0 has then printed why.
bool open_outputs(Communicator& comm, const BenchOptions& o, std::optional<OutputFile>& json,
                  std::optional<OutputFile>& csv) {
  std::int32_t failed = 0;
  if (comm.rank() == 0) {
    try {
      json.emplace("--json", o.json_path);
      csv.emplace("--csv", o.csv_path);
    } catch (const SystemError& e) {
      std::fprintf(stderr, "braid-bench: %s\n", e.what());
      failed = 1;
    }
  }
  comm.broadcast(&failed, &failed, 1, DataType::i32, 0).wait();
  return failed == 0;
}

}  // namespace

// Capped by the memory limit: the baseline took 512 MiB before any check,
// and a run of 8-byte calls under a small limit failed "out of memory
// allocating 268435456 bytes".
double measure_memcpy_gbps(std::size_t& bytes) {
  const int local_ranks = std::max(1, runtime::rank_info_from_env().local_world_size);
  const std::vector<runtime::MemoryLimit> limits = runtime::memory_limits();
  if (const runtime::MemoryLimit* limit = runtime::tightest(limits, local_ranks))
    bytes = std::min(bytes, std::max<std::size_t>(
                                static_cast<std::size_t>(std::max(0.0, runtime::per_rank(*limit, local_ranks)) / 4),
                                1u << 20));
  HugeBuffer a(bytes, std::byte{1}), b(bytes, std::byte{2});
  double best = 0;
  for (int trial = 0; trial < 4; ++trial) {
    auto start = std::chrono::steady_clock::now();
    std::memcpy(b.data, a.data, bytes);
    double s = Seconds(std::chrono::steady_clock::now() - start).count();
    best = std::max(best, bytes / s / 1e9);
    a.data[trial] = b.data[bytes - 1 - trial];  // keep the copies observable
  }
  return best;
}

namespace {

struct Totals {
  double busbw_sum = 0;
  int rows = 0;
  std::uint64_t wrong = 0;
};

// One sweep of sizes for one dtype and op: prints its rows (rank 0) and
// appends them to `rows`.
// The baseline, and busbw relative to it, in JSON: null where none was
// measured (--memcpy_bytes 0).
nlohmann::json baseline_json(double memcpy_gbps) {
  return memcpy_gbps > 0 ? nlohmann::json(memcpy_gbps) : nlohmann::json();
}
nlohmann::json per_memcpy_json(double busbw, double memcpy_gbps) {
  return memcpy_gbps > 0 ? nlohmann::json(busbw / memcpy_gbps) : nlohmann::json();
}

void run_sweep(Communicator& comm, const BenchOptions& o, double memcpy_gbps, nlohmann::json& rows, Totals& totals) {
  const int n = comm.size(), r = comm.rank();
  const std::size_t es = dtype_bytes(o.dtype);
  const bool reduces = o.collective == "all_reduce" || o.collective == "reduce_scatter" || o.collective == "reduce";
  const bool rooted = o.collective == "broadcast" || o.collective == "reduce";
  Runner runner(comm, o);
  AlgorithmChoice last_choice;
  // As nccl-tests does, a warm-up at the sweep's largest size, then its
  // smallest, before the first row: the first couple of MiB a pair of
  // ranks moves through shared memory map the ring's pages (minor faults;
  // 128 KiB calls took 1 ms each for their first 16, 60 us after, so the
  // first row of a sweep read 20x slow under -w 5; found by a review
  // helper). At least 8 MiB or 64 calls at the largest size.
  const std::vector<std::size_t> sizes = sweep_sizes(o);
  if (o.warmup > 0 && !sizes.empty()) {
    constexpr std::size_t kWarmBytes = std::size_t{8} << 20;
    const std::size_t largest = std::max<std::size_t>(sizes.back(), 1);
    const int calls = std::max(o.warmup, static_cast<int>(std::min<std::size_t>(64, kWarmBytes / largest + 1)));
    for (std::size_t bytes : {sizes.back(), sizes.front()}) {
      runner.prepare(make_case(o.collective, bytes, es, n));
      for (int i = 0; i < (bytes == sizes.back() ? calls : o.warmup); ++i) runner.issue(false).wait();
    }
  }
  for (std::size_t bytes : sizes) {
    Case c = make_case(o.collective, bytes, es, n);
    std::size_t actual_bytes = std::max(c.send_elems, c.recv_elems) * es;
    runner.prepare(c);
    Result out = measure(comm, runner, false, o.check);
    // A ring shift of sends and receives has no in-place form: its in-place
    // columns read N/A (they were copies of the out-of-place ones).
    const bool has_in_place = o.collective != "send_recv";
    Result in = has_in_place ? measure(comm, runner, true, o.check) : Result{};
    const AlgorithmChoice& choice = out.choice;  // what select.cc returned for the timed calls
    std::string path = comm.transport_summary() + ":" + choice.name;
    if (choice.name == "cuda_ipc") path = "cuda_ipc:direct";
    else if (o.cuda) path = "staged+" + path;
    auto algbw = [&](const Result& res) { return res.seconds > 0 ? actual_bytes / res.seconds / 1e9 : 0.0; };
    double out_bus = algbw(out) * c.bus_factor, in_bus = algbw(in) * c.bus_factor;
    totals.wrong += out.wrong + in.wrong;
    totals.busbw_sum += has_in_place ? (out_bus + in_bus) / 2 : out_bus;
    ++totals.rows;
    if (r != 0) continue;
    if (choice.name != last_choice.name)  // the rows below run it; say why, as select.cc did
      std::printf("# %s: %s\n", path.c_str(), choice.reason.c_str());
    last_choice = choice;
    // #wrong reads N/A under -c 0, as in nccl-tests: nothing was checked.
    auto columns = [&](const Result& res, double bus, bool measured) {
      char text[96];
      if (!measured) {
        std::snprintf(text, sizeof text, "%10s %8s %8s %6s %7s", "N/A", "N/A", "N/A", "N/A", "N/A");
        return std::string(text);
      }
      const std::string wrong = o.check ? std::to_string(res.wrong) : "N/A";
      char per_memcpy[16] = "N/A";
      if (memcpy_gbps > 0) std::snprintf(per_memcpy, sizeof per_memcpy, "%.3f", bus / memcpy_gbps);
      std::snprintf(text, sizeof text, "%10.2f %8.3f %8.3f %6s %7s", res.seconds * 1e6, algbw(res), bus, per_memcpy,
                    wrong.c_str());
      return std::string(text);
    };
    std::printf(" %12zu %12zu %6s %6s %5d %-26s %s %s\n", actual_bytes, c.count, std::string(name(o.dtype)).c_str(),
                reduces ? std::string(name(o.op)).c_str() : "none", rooted ? o.root : -1, path.c_str(),
                columns(out, out_bus, true).c_str(), columns(in, in_bus, has_in_place).c_str());
    std::fflush(stdout);
    auto group = [&](const Result& res, double bus, bool measured) {
      if (!measured) return nlohmann::json();  // null
      nlohmann::json wrong = o.check ? nlohmann::json(res.wrong) : nlohmann::json();
      return nlohmann::json{{"time_us", res.seconds * 1e6}, {"algbw_gbps", algbw(res)}, {"busbw_gbps", bus},
                            {"busbw_per_memcpy", per_memcpy_json(bus, memcpy_gbps)}, {"wrong", wrong}};
    };
    // Kept for --json and --csv only: under -N 0 the sweep runs until
    // stopped, and rank 0's memory grew row by row.
    if (o.json_path.empty() && o.csv_path.empty()) continue;
    rows.push_back({{"collective", o.collective}, {"bytes", actual_bytes}, {"count", c.count},
                    {"dtype", name(o.dtype)}, {"op", reduces ? std::string(name(o.op)) : "none"},
                    {"root", rooted ? o.root : -1}, {"ranks", n}, {"transport", comm.transport_summary()},
                    {"algorithm", choice.name}, {"algorithm_reason", choice.reason},
                    {"out_of_place", group(out, out_bus, true)}, {"in_place", group(in, in_bus, has_in_place)},
                    {"memcpy_gbps", baseline_json(memcpy_gbps)}});
  }
}

// The JSON file: the run's parameters, where it ran, and every row.
nlohmann::json run_json(Communicator& comm, const BenchOptions& o, double memcpy_gbps, const Totals& totals,
                        nlohmann::json rows) {
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  nlohmann::json transports = nlohmann::json::array();
  for (int p = 0; p < comm.size(); ++p) transports.push_back({{"peer", p}, {"transport", comm.transport_of(p)}});
  nlohmann::json dtypes = nlohmann::json::array(), ops = nlohmann::json::array();
  for (DataType d : o.dtypes) dtypes.push_back(name(d));
  for (ReduceOp op : o.ops) ops.push_back(name(op));
  const nlohmann::json parameters = {
      {"collective", o.collective}, {"minbytes", o.min_bytes}, {"maxbytes", o.max_bytes},
      {"stepfactor", o.factor},    {"stepbytes", o.step_bytes}, {"iters", o.iters},
      {"warmup_iters", o.warmup},  {"agg_iters", o.agg_iters}, {"run_cycles", o.cycles},
      {"check", o.check},          {"root", o.root},           {"average", o.average},
      {"blocking", o.blocking},    {"report_cputime", o.cpu_time}, {"stream_null", o.null_stream},
      {"timeout_s", o.timeout_s},  {"datatypes", dtypes},      {"ops", ops},
      {"registered", o.registered}, {"device", o.cuda ? "cuda" : "cpu"}, {"memcpy_bytes", o.memcpy_bytes}};
  return {{"tool", "braid-bench"}, {"version", BRAID_VERSION}, {"host", host}, {"ranks", comm.size()},
          {"transport", comm.transport_summary()}, {"transports_from_rank_0", transports},
          {"parameters", parameters}, {"memcpy_gbps", baseline_json(memcpy_gbps)},
          {"average_busbw_gbps", totals.rows ? totals.busbw_sum / totals.rows : 0.0},
          {"out_of_bounds", o.check ? nlohmann::json(totals.wrong) : nlohmann::json(nullptr)},
          {"rows", std::move(rows)}};
}

std::unique_ptr<Communicator> world(const BenchOptions& o) {
  runtime::Config config = runtime::config();
  if (o.timeout_s > 0)  // -T, whole milliseconds as BRAID_TIMEOUT
    config.timeout = std::chrono::milliseconds(std::max<long long>(1, std::llround(o.timeout_s * 1000)));
  return Communicator::create_world(runtime::rank_info_from_env(), config);
}

}  // namespace

int run_bench(const BenchOptions& options) {
  auto comm = world(options);
  const int n = comm->size(), r = comm->rank();
  if (options.collective == "send_recv" && n == 1)
    throw InvalidUsage("--coll send_recv shifts a ring of ranks: it needs 2 ranks or more (braid-launch -n 2)");
  if ((options.collective == "broadcast" || options.collective == "reduce") && options.root >= n)
    throw InvalidUsage("--root " + std::to_string(options.root) + " is out of range for " + std::to_string(n) + " ranks");
  if (options.cuda) bench_device::init(runtime::rank_info_from_env().local_rank);
  double memcpy_gbps = 0;
  std::size_t memcpy_bytes = options.memcpy_bytes;  // rank 0's, as copied (the memory limit may lower it)
  if (r == 0 && memcpy_bytes > 0)
    memcpy_gbps = options.cuda ? bench_device::measure_copy_gbps(memcpy_bytes) : measure_memcpy_gbps(memcpy_bytes);
  if (r == 0 && memcpy_bytes != options.memcpy_bytes)
    std::printf("# --memcpy_bytes %zu lowered to %zu: a quarter of what the memory limit leaves this rank\n",
                options.memcpy_bytes, memcpy_bytes);
  comm->broadcast(&memcpy_gbps, &memcpy_gbps, 1, DataType::f64, 0).wait();
  std::optional<OutputFile> json_file, csv_file;
  // The files are rank 0's: it alone fails, so a launcher names it as the rank that failed.
  if (!open_outputs(*comm, options, json_file, csv_file)) return r == 0 ? 1 : 0;
  const bool reduces = options.collective == "all_reduce" || options.collective == "reduce_scatter" ||
                       options.collective == "reduce";
  // A collective that does not reduce takes sum's inputs (verify.cc):
  // prod's are mostly 1, and a broadcast of them checked a constant buffer.
  const ReduceOp moving = ReduceOp::sum;
  const std::vector<ReduceOp> ops = reduces ? options.ops : std::vector<ReduceOp>{moving};
  // The bitwise operators reduce the integer types only: under -d all or
  // -o all the other pairs are left out; given alone, refused.
  auto pair_runs = [&](DataType dtype, ReduceOp op) { return !reduces || can_reduce(dtype, op); };
  bool any = false;
  for (DataType dtype : options.dtypes)
    for (ReduceOp op : ops) any = any || pair_runs(dtype, op);
  if (!any)
    throw InvalidUsage("-o " + std::string(name(ops.front())) + " is a bitwise operator, for the integer types (-d i8, "
                       "u8, i32, i64), not for -d " + std::string(name(options.dtypes.front())));
  BenchOptions capped = options;
  capped.max_bytes = capped_max_bytes(*comm, options);
  capped.memcpy_bytes = memcpy_bytes;  // the JSON's parameters say what was copied
  nlohmann::json rows = nlohmann::json::array();
  Totals totals;
  for (int cycle = 0; options.cycles == 0 || cycle < options.cycles; ++cycle)
    for (DataType dtype : options.dtypes)
      for (ReduceOp op : ops) {
        if (!pair_runs(dtype, op)) continue;
        BenchOptions o = capped;
        o.dtype = dtype;
        o.op = op;
        if (r == 0) print_header(*comm, o, memcpy_gbps);
        run_sweep(*comm, o, memcpy_gbps, rows, totals);
      }
  if (r == 0) {
    if (options.check)
      std::printf("# Out of bounds values : %llu %s\n", (unsigned long long)totals.wrong, totals.wrong ? "FAILED" : "OK");
    else  // -c 0: nothing was checked, so no count of 0 to show
      std::printf("# Out of bounds values : N/A (-c 0)\n");
    const double average = totals.rows ? totals.busbw_sum / totals.rows : 0.0;
    if (memcpy_gbps > 0)
      std::printf("# Avg bus bandwidth    : %.3f GB/s (%.3f x memcpy)\n", average, average / memcpy_gbps);
    else
      std::printf("# Avg bus bandwidth    : %.3f GB/s\n", average);
    // Both files are tried; a failure of the first did not leave the
    // second empty and unnamed.
    std::string failed;
    nlohmann::json run = run_json(*comm, capped, memcpy_gbps, totals, rows);
    run["parameters"]["maxbytes_requested"] = options.max_bytes;  // -e as given; maxbytes is the sweep's (lowered)
    for (auto [file, text] : {std::pair{&*json_file, run.dump(2) + "\n"},
                              std::pair{&*csv_file, csv_text(rows)}}) {
      try {
        file->write_and_close(text);
      } catch (const SystemError& e) {
        failed += (failed.empty() ? "" : "; ") + std::string(e.what());
      }
    }
    if (!failed.empty()) throw SystemError(failed);
  }
  return totals.wrong ? 1 : 0;
}

}  // namespace braid::comm
