// braid-launch: starts N ranks of a program on this node with the braid
// rank environment, serves their rendezvous store, and supervises them.
// The command line lives here; the machinery in tools/launcher/.
#include <CLI/CLI.hpp>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <thread>

#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <optional>
#include <string>
#include <vector>

#include "runtime/decimal.h"
#include "runtime/errors.h"
#include "runtime/log.h"
#include "tools/decimal_flag.h"
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
    const std::string option = rest.front().substr(0, rest.front().find('='));  // --monitor_interval=5
    // Before a '--' it is braid-launch's own, which it does not have (a
    // torchrun option such as --tee): "put the program after '--'" told a
    // user who had (a review helper's case).
    if (std::find(rest.begin(), rest.end(), "--") != rest.end())
      throw braid::InvalidUsage("unknown option '" + option + "': braid-launch has no such option (--help lists "
                                "them; each rank's output is prefixed and kept with --log-dir)");
    throw braid::InvalidUsage("unknown option '" + option + "'; put the program and its arguments after '--'");
  }
  return rest;
}

// torchrun's spellings (--nproc_per_node, --master_addr, ...) are accepted
// beside braid's, with the same meanings.
struct CliExtras {
  std::string nproc = "";
  std::string nnodes = "1";
  std::string stdin_rank = "0";
  bool standalone = false;
  // torchrun's rendezvous and Python options.
  std::string rdzv_endpoint, rdzv_backend, rdzv_id;
  bool module = false;
  bool no_python = false;
};

void add_options(CLI::App& app, LaunchOptions& options, CliExtras& extras, double& timeout_s, double& grace_s) {
  // Required, but checked after the parse (main): CLI11 stops at the first
  // option it does not know and leaves the rest, -n included, to the
  // program, so a torchrun-only option before -n (--tee, --redirects) read
  // "--nproc-per-node is required" instead of naming the option.
  app.add_option("-n,--nproc-per-node,--nproc_per_node", extras.nproc,
                 "ranks to start on this node (required); auto: one per core");
  app.add_option("--nnodes", extras.nnodes, "nodes in the job (torchrun's MIN:MAX only as N or N:N)")
      ->capture_default_str();
  app.add_option("--node-rank,--node_rank", options.node_rank,
                 "this node's index in [0, nnodes); without it, nodes are numbered as they reach node 0's store "
                 "(node 0: the one at --master-addr; needs BRAID_JOB_TOKEN on every node)")
      ->transform(braid::tools::decimal(options.node_rank));
  app.add_option("--master-addr,--master_addr", options.master_addr, "address where ranks reach the store")
      ->capture_default_str();
  app.add_option("--master-port,--master_port", options.master_port,
                 "store port; default (or 0) on one node: a free port (required with --nnodes > 1)")
      ->transform(braid::tools::decimal(options.master_port));
  app.add_flag("--standalone", extras.standalone,
               "one node, its store on a free port of 127.0.0.1 (torchrun's --standalone)");
  app.add_option("--rdzv-endpoint,--rdzv_endpoint", extras.rdzv_endpoint,
                 "torchrun's HOST[:PORT] of the rendezvous: --master-addr HOST --master-port PORT (29400 unless "
                 "given)");
  app.add_option("--rdzv-backend,--rdzv_backend", extras.rdzv_backend,
                 "torchrun's c10d or static: node 0 serves the store either way");
  app.add_option("--rdzv-id,--rdzv_id", extras.rdzv_id, "torchrun's job id: BRAID_RUN_ID unless that is set");
  app.add_flag("-m,--module", extras.module, "run PROGRAM as a Python module (python3 -u -m PROGRAM), as torchrun -m");
  app.add_flag("--no-python,--no_python", extras.no_python,
               "never run PROGRAM with Python (otherwise a .py PROGRAM runs as python3 -u PROGRAM, as torchrun "
               "runs its script, unless it is a path with its x bit and a #! line)");
  app.add_option("--max-restarts,--max_restarts", options.max_restarts,
                 "on a rank's failure stop every rank and start them all again, at most this many times "
                 "(ranks see BRAID_RESTART_COUNT / TORCHELASTIC_RESTART_COUNT)")
      ->transform(braid::tools::decimal(options.max_restarts))
      ->capture_default_str();
  app.add_option("--log-dir,--log_dir", options.log_dir,
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

// The whole of `text` as an int in decimal digits, a '-' at most before
// them; none for anything else (trailing text, out of range, empty, and
// the leading space and '+' that stoi skipped).
std::optional<int> whole_number(const std::string& text) {
  if (!braid::runtime::is_decimal_integer(text.c_str())) return std::nullopt;
  int value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc() || end != text.data() + text.size()) return std::nullopt;
  return value;
}

// torchrun's --nnodes takes MIN:MAX for elastic jobs; one size only here.
int parse_nnodes(const std::string& text) {
  const std::size_t colon = text.find(':');
  auto number = [&](const std::string& part) {
    const std::optional<int> value = whole_number(part);
    if (!value) throw braid::InvalidUsage("--nnodes '" + text + "' must be a number of nodes (or N:N)");
    return *value;
  };
  if (colon == std::string::npos) return number(text);
  const int low = number(text.substr(0, colon)), high = number(text.substr(colon + 1));
  if (low != high)
    throw braid::InvalidUsage("--nnodes " + text + " asks for an elastic job of " + std::to_string(low) + " to " +
                              std::to_string(high) + " nodes; braid-launch runs a fixed number: pass one");
  return low;
}

// torchrun's --rdzv-endpoint HOST[:PORT] ([V6]:PORT too) names node 0's
// store, as --master-addr and --master-port do here; its default port.
void apply_rendezvous(const CliExtras& extras, LaunchOptions& options, bool master_given) {
  if (!extras.rdzv_backend.empty() && extras.rdzv_backend != "c10d" && extras.rdzv_backend != "static")
    throw braid::InvalidUsage("--rdzv-backend " + extras.rdzv_backend +
                              " is not supported: node 0's braid-launch serves the store (as c10d or static do)");
  if (!extras.rdzv_id.empty()) setenv("BRAID_RUN_ID", extras.rdzv_id.c_str(), 0);
  if (extras.rdzv_endpoint.empty()) return;
  if (master_given)
    throw braid::InvalidUsage("--rdzv-endpoint and --master-addr/--master-port both name node 0's store: pass one");
  std::string host = extras.rdzv_endpoint, port = "29400";
  if (host.front() == '[') {
    const std::size_t close = host.find(']');
    if (close == std::string::npos) throw braid::InvalidUsage("--rdzv-endpoint " + host + " lacks its ']'");
    if (close + 1 < host.size()) {
      if (host[close + 1] != ':') throw braid::InvalidUsage("--rdzv-endpoint " + host + " is not [HOST]:PORT");
      port = host.substr(close + 2);
    }
    host = host.substr(1, close - 1);
  } else if (const std::size_t colon = host.rfind(':');
             colon != std::string::npos && host.find(':') == colon) {  // one colon: HOST:PORT
    port = host.substr(colon + 1);
    host = host.substr(0, colon);
  }
  const std::optional<int> number = whole_number(port);
  if (!number) throw braid::InvalidUsage("--rdzv-endpoint " + extras.rdzv_endpoint + ": '" + port + "' is not a port");
  // An empty host was refused later as "--master-addr must not be empty",
  // an option the user never passed.
  if (host.empty())
    throw braid::InvalidUsage("--rdzv-endpoint " + extras.rdzv_endpoint + " names no host: give HOST:PORT");
  options.master_port = *number;
  options.master_addr = host;
}

// Whether exec would run `program` as the user means it: a path with its x
// bit and a "#!" line. torchrun takes its script as a path and runs it with
// Python whatever its bits; exec looked a bare name up in PATH ("No such
// file" for train.py beside the user) and ran an x-bit file without "#!"
// with /bin/sh.
bool runs_by_itself(const std::string& program) {
  if (program.find('/') == std::string::npos || access(program.c_str(), X_OK) != 0) return false;
  char head[2] = {};
  const int fd = open(program.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return true;  // exec says why
  const bool shebang = read(fd, head, 2) == 2 && head[0] == '#' && head[1] == '!';
  close(fd);
  return shebang;
}

// torchrun runs its script with Python, unbuffered; braid-launch runs any
// program. A .py file that exec would not run as meant (runs_by_itself)
// runs as torchrun runs it, with BRAID_PYTHON or python3 from PATH; -m runs
// a module.
std::vector<std::string> with_python(std::vector<std::string> command, const CliExtras& extras) {
  if (extras.module && extras.no_python)
    throw braid::InvalidUsage("-m runs a Python module and --no-python runs no Python: pass one");
  const char* chosen = std::getenv("BRAID_PYTHON");
  const std::string python = chosen && *chosen ? chosen : "python3";
  if (command.empty() || extras.no_python) return command;
  const std::string& program = command.front();
  const bool script = program.size() > 3 && program.ends_with(".py") && access(program.c_str(), F_OK) == 0 &&
                      !runs_by_itself(program);
  if (!extras.module && !script) return command;
  std::vector<std::string> prefix{python, "-u"};
  if (extras.module) prefix.push_back("-m");
  command.insert(command.begin(), prefix.begin(), prefix.end());
  return command;
}

void apply_extras(const CliExtras& extras, LaunchOptions& options) {
  options.nnodes = parse_nnodes(extras.nnodes);
  if (extras.nproc == "auto") {
    options.nproc_per_node = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  } else {
    const std::optional<int> nproc = whole_number(extras.nproc);
    if (!nproc)
      throw braid::InvalidUsage("--nproc-per-node '" + extras.nproc + "' must be a number of ranks or 'auto'");
    options.nproc_per_node = *nproc;
  }
  if (extras.stdin_rank == "none") {
    options.stdin_rank = braid::launcher::kNoStdinRank;
  } else {
    const std::optional<int> rank = whole_number(extras.stdin_rank);
    if (!rank || *rank < 0) throw braid::InvalidUsage("--stdin '" + extras.stdin_rank + "' must be a rank or 'none'");
    options.stdin_rank = *rank;
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
  // A flag given twice takes the last value, as torchrun's argparse does
  // (CLI11 refused it: "At Most 1 required but received 2").
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
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
    std::vector<std::string> program = program_arguments(app.remaining());
    if (app.count("--nproc-per-node") == 0)
      throw braid::InvalidUsage("--nproc-per-node (-n) is required\nRun with --help for more information.");
    options.command = with_python(std::move(program), extras);
    apply_rendezvous(extras, options, app.count("--master-addr") + app.count("--master-port") > 0);
    apply_extras(extras, options);  // --standalone last: it overrides the rendezvous, as torchrun's does
    if (extras.standalone && app.count("--master-addr") + app.count("--master-port") + app.count("--rdzv-endpoint") > 0)
      std::fprintf(stderr, "braid-launch: --standalone puts the store on a free port of 127.0.0.1; the --master-addr, "
                           "--master-port or --rdzv-endpoint given is not used\n");
    if (options.nnodes > 1 && app.count("--node-rank") == 0) options.node_rank = braid::launcher::kJoinOrderNodeRank;
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
