// braid-launch: starts N ranks of a program on this node with the braid
// rank environment, serves their rendezvous store, and supervises them.
// The command line lives here; the machinery in tools/launcher/.
#include <CLI/CLI.hpp>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <thread>

#include <chrono>
#include <cmath>
#include <exception>
#include <string>
#include <vector>

#include "runtime/errors.h"
#include "runtime/log.h"
#include "tools/launcher/launcher.h"
#include "tools/launcher/output.h"

namespace {

using braid::launcher::LaunchOptions;

// Started with stdin, stdout or stderr closed (`>&-`), the launcher would
// hand those numbers to the first descriptors it opens (its signalfd took
// 1), then queue the ranks' output for that "stdout" and wait forever for
// it to become writable. /dev/null takes a closed one's place first, as
// what is written there would have gone nowhere anyway.
void open_standard_descriptors() {
  for (int fd = 0; fd <= 2; ++fd) {
    if (fcntl(fd, F_GETFD) >= 0 || errno != EBADF) continue;
    const int opened = open("/dev/null", fd == 0 ? O_RDONLY : O_WRONLY);  // the lowest free number: fd
    if (opened > fd) {
      dup2(opened, fd);
      close(opened);
    }
  }
}

// Seconds as given to --timeout or --grace-period. Beyond kMaxDuration,
// `inf` included, a value is taken as kMaxDuration: about 31 years, in
// effect no limit, as timeout(1) (whose exit status 124 --timeout copies)
// takes `inf` and huge durations; refusing them would only make a user
// pick a smaller huge number. Clamping before the conversion keeps the
// milliseconds and the deadlines computed from them from overflowing. A
// fraction of a millisecond rounds up, so that a tiny timeout does not
// become 0, which means none.
std::chrono::milliseconds from_seconds(double seconds, const std::string& option) {
  if (std::isnan(seconds)) throw braid::InvalidUsage(option + " must be a number of seconds, got nan");
  if (seconds < 0) throw braid::InvalidUsage(option + " must not be negative");
  const double most = static_cast<double>(braid::launcher::kMaxDuration.count());
  return std::chrono::milliseconds(static_cast<long long>(std::ceil(std::min(seconds, most) * 1000.0)));
}

// CLI11 leaves everything from the first positional argument on (or from
// "--") to us; a leading option it did not know is a typo, not a program.
std::vector<std::string> program_arguments(std::vector<std::string> rest) {
  if (!rest.empty() && rest.front() == "--") {
    rest.erase(rest.begin());
  } else if (!rest.empty() && rest.front().starts_with("-")) {
    throw braid::InvalidUsage("unknown option '" + rest.front() +
                              "'; put the program and its arguments after '--'");
  }
  return rest;
}

// torchrun's spellings (--nproc_per_node, --master_addr, ...) are accepted
// beside braid's, with the same meanings.
struct CliExtras {
  std::string nproc = "";
  std::string stdin_rank = "0";
  bool standalone = false;
};

void add_options(CLI::App& app, LaunchOptions& options, CliExtras& extras, double& timeout_s, double& grace_s) {
  app.add_option("-n,--nproc-per-node,--nproc_per_node", extras.nproc,
                 "ranks to start on this node; auto: one per core")
      ->required();
  app.add_option("--nnodes", options.nnodes, "nodes in the job")->capture_default_str();
  app.add_option("--node-rank,--node_rank", options.node_rank, "this node's index in [0, nnodes)")
      ->capture_default_str();
  app.add_option("--master-addr,--master_addr", options.master_addr, "address where ranks reach the store")
      ->capture_default_str();
  app.add_option("--master-port,--master_port", options.master_port,
                 "store port; default on one node: a free port (required with --nnodes > 1)");
  app.add_flag("--standalone", extras.standalone,
               "one node, its store on a free port of 127.0.0.1 (torchrun's --standalone)");
  app.add_option("--max-restarts,--max_restarts", options.max_restarts,
                 "on a rank's failure stop every rank and start them all again, at most this many times "
                 "(ranks see BRAID_RESTART_COUNT / TORCHELASTIC_RESTART_COUNT)")
      ->capture_default_str();
  app.add_option("--log-dir", options.log_dir,
                 "write each rank's output to DIR/rank_<r>.out and .err (rank_<r>.restart<k>.* after the k-th "
                 "restart) instead of relaying it");
  app.add_option("--stdin", extras.stdin_rank,
                 "the rank that reads braid-launch's stdin (through a pipe; the others read /dev/null), or "
                 "'none'")
      ->capture_default_str();
  app.add_option("--timeout", timeout_s,
                 "stop the job after this many seconds (exit 124); 0: no limit; beyond 1e9 (or inf): 1e9");
  app.add_option("--grace-period", grace_s,
                 "seconds between SIGTERM and SIGKILL when stopping, and (at least 2) for output to drain "
                 "then; beyond 1e9 (or inf): 1e9")
      ->capture_default_str();
}

void apply_extras(const CliExtras& extras, LaunchOptions& options) {
  if (extras.nproc == "auto") {
    options.nproc_per_node = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  } else {
    try {
      std::size_t used = 0;
      options.nproc_per_node = std::stoi(extras.nproc, &used);
      if (used != extras.nproc.size()) throw std::invalid_argument("trailing text");
    } catch (const std::exception&) {
      throw braid::InvalidUsage("--nproc-per-node '" + extras.nproc + "' must be a number of ranks or 'auto'");
    }
  }
  if (extras.stdin_rank == "none") {
    options.stdin_rank = braid::launcher::kNoStdinRank;
  } else {
    try {
      std::size_t used = 0;
      options.stdin_rank = std::stoi(extras.stdin_rank, &used);
      if (used != extras.stdin_rank.size() || options.stdin_rank < 0) throw std::invalid_argument("not a rank");
    } catch (const std::exception&) {
      throw braid::InvalidUsage("--stdin '" + extras.stdin_rank + "' must be a rank or 'none'");
    }
  }
  if (extras.standalone) {
    if (options.nnodes != 1) throw braid::InvalidUsage("--standalone runs one node; drop --nnodes or --standalone");
    options.master_addr = "127.0.0.1";
    options.master_port = 0;
  }
}

}  // namespace

int main(int argc, char** argv) {
  open_standard_descriptors();
  CLI::App app{"Start N ranks of a braid program on this node and supervise them.\n"
               "usage: braid-launch --nproc-per-node N [options] -- PROGRAM [ARGS...]"};
  LaunchOptions options;
  CliExtras extras;
  double timeout_s = 0;
  double grace_s = 5;
  add_options(app, options, extras, timeout_s, grace_s);
  app.footer(
      "Ranks get BRAID_RANK, BRAID_WORLD_SIZE, BRAID_LOCAL_RANK, BRAID_LOCAL_WORLD_SIZE,\n"
      "BRAID_NODE_RANK, BRAID_STORE_ADDR, BRAID_JOB_TOKEN, BRAID_RUN_ID, BRAID_RESTART_COUNT\n"
      "and torchrun's RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK, GROUP_WORLD_SIZE,\n"
      "ROLE_NAME, ROLE_RANK, ROLE_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, TORCHELASTIC_RUN_ID,\n"
      "TORCHELASTIC_RESTART_COUNT, TORCHELASTIC_MAX_RESTARTS.\n"
      "With --nnodes > 1, set BRAID_JOB_TOKEN to one secret on every node; without it node 0\n"
      "generates one and prints how to pass it on, and the other nodes refuse to start.\n"
      "Without BRAID_BIND_ADDR, ranks of such a job listen on the address that routes to\n"
      "--master-addr. The soft RLIMIT_NOFILE is raised to the hard one when the job needs it.\n"
      "Each rank runs in a process group of its own. Should braid-launch be killed (even with\n"
      "SIGKILL), a guardian process it started sends those groups SIGTERM, then SIGKILL after\n"
      "--grace-period, so that what the ranks started in their groups does not run on.\n"
      "Exit status: 0 when every rank exits 0; else the first failing rank's status\n"
      "(128+N for signal N); 128+N when braid-launch receives signal N; 2 for bad\n"
      "arguments; 124 when --timeout expires; 127 when the program cannot be executed.");
  app.prefix_command();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int status = app.exit(e);
    return status == 0 ? 0 : braid::launcher::kExitUsage;
  }
  int status = 1;
  try {
    options.command = program_arguments(app.remaining());
    apply_extras(extras, options);
    options.timeout = from_seconds(timeout_s, "--timeout");
    options.grace_period = from_seconds(grace_s, "--grace-period");
    braid::runtime::setup_logging(-1);
    braid::launcher::log_without_blocking();
    status = braid::launcher::launch(options);
  } catch (const braid::InvalidUsage& e) {
    braid::launcher::say(e.what());
    status = braid::launcher::kExitUsage;
  } catch (const std::exception& e) {
    braid::launcher::say(e.what());
    status = 1;
  }
  // Messages that stdout or stderr did not take at once (the supervisor has
  // written out, or given up on, the ranks' output) get a short, bounded
  // wait; a stalled reader must not keep the launcher from exiting.
  braid::launcher::drain_output(std::chrono::seconds(2));
  return status;
}
