#!/bin/sh
# The real launchers on one node (issue 17), each running braid-bench with
# every value checked:
#   1. torchrun --standalone (Debian's python3-torch: PYTHON -m
#      torch.distributed.run), 2 ranks;
#   2. two torchrun jobs at once whose MASTER_PORTs are one apart: the first
#      job's store must keep off the second's agent port;
#   3. two mpirun jobs at once given the same MASTER_PORT, where each rank 0
#      serves braid's store: the second finds the port taken and moves on.
# In 2 and 3 the four ranks meet at a barrier (files in a temporary folder)
# before braid starts, so both jobs are up together, and in 3 the second
# job's ranks wait until a store listens on MASTER_PORT (AFTER), which only
# the first job's rank 0 may then hold, and the first job's rank 1 waits
# until the second job is done, so that rank 0 holds its store all the
# while: the stores always meet. (Without AFTER, a first rank 0 slow to
# start found the port free again after the whole second job had run.)
#
# usage: launchers.sh BRAID_BENCH PYTHON FREE_PORTS_PY
# A part whose launcher is missing says SKIP; the test exits 77 (skip) when
# both are (python3-torch and openmpi-bin; scripts/setup.sh installs them).
set -eu
bench=$1
python=$2
free_ports=$3
tmp=$(mktemp -d "${TMPDIR:-/tmp}/braid-launchers.XXXXXX")
trap 'rm -rf "$tmp"' EXIT INT TERM
export BRAID_TIMEOUT=60 OMP_NUM_THREADS=1 BENCH="$bench" D="$tmp"
export ARGS="--coll all_reduce -b 8 -e 64K -f 8 -n 2 -w 1 -c 1 --memcpy_bytes 0"
ran=0

fail() { echo "launchers test: FAIL: $*" >&2; exit 1; }

# NAME LOG STATUS: the run exited 0 and printed braid-bench's checked result.
expect_ok() {
  [ "$3" -eq 0 ] || fail "$1 exited $3:
$(cat "$2")"
  grep -q "Out of bounds values : 0 OK" "$2" || fail "$1 printed no checked result:
$(cat "$2")"
  echo "launchers test: $1: ok"
}

# A rank: marks itself up, waits (at most 100 s) until all four ranks of the
# two jobs are, the rank named by HOLD until $D/second.done exists, and
# every rank, where AFTER names a port, until a socket listens on it
# (/proc/net/tcp, state 0A), then becomes braid-bench.
rank_script='r=${RANK:-$OMPI_COMM_WORLD_RANK}; touch "$D/$JOB.$r.up"; i=0
listening() { [ -z "${AFTER:-}" ] || grep -q ":$(printf %04X "$AFTER") 00000000:0000 0A " /proc/net/tcp; }
while [ "$(ls "$D" | grep -c "\.up$")" -lt 4 ] || { [ "$HOLD" = "$r" ] && [ ! -e "$D/second.done" ]; } || ! listening; do
  i=$((i + 1)); [ $i -le 1000 ] || exit 3; sleep 0.1; done
exec "$BENCH" $ARGS'

# Waits for two background runs; fails naming the first that failed.
wait_both() {
  s1=0; wait "$1" || s1=$?
  s2=0; wait "$2" || s2=$?
  expect_ok "$3 (first job)" "$tmp/first.log" "$s1"
  expect_ok "$3 (second job)" "$tmp/second.log" "$s2"
}

if "$python" -c 'import torch.distributed.run' 2>/dev/null; then
  ran=1
  # --redirects/--tee name a local rank that does not exist: Debian's
  # torchrun 1.13 on Python 3.11 fails at start on their default "0".
  torchrun() { timeout -k 5 150 "$python" -m torch.distributed.run --nnodes 1 --nproc_per_node 2 \
    --redirects 9:1 --tee 9:1 "$@"; }
  s=0; torchrun --standalone --no_python "$bench" $ARGS >"$tmp/standalone.log" 2>&1 || s=$?
  expect_ok "torchrun --standalone" "$tmp/standalone.log" "$s"

  port=$("$python" "$free_ports")  # P and P + 1 both free
  JOB=first HOLD=none torchrun --master_addr 127.0.0.1 --master_port "$port" --no_python sh -c "$rank_script" \
    >"$tmp/first.log" 2>&1 & first=$!
  JOB=second HOLD=none torchrun --master_addr 127.0.0.1 --master_port $((port + 1)) --no_python \
    sh -c "$rank_script" >"$tmp/second.log" 2>&1 & second=$!
  wait_both "$first" "$second" "torchrun, MASTER_PORTs $port and $((port + 1))"
  rm -f "$tmp"/*.up
else
  echo "launchers test: SKIP torchrun parts: $python has no torch (python3-torch)"
fi

if command -v mpirun >/dev/null 2>&1; then
  ran=1
  root_flag=""
  [ "$(id -u)" -ne 0 ] || root_flag="--allow-run-as-root"
  port=$(python3 "$free_ports")
  # Each job its own session directory: two mpirun starting at once race
  # to create the shared /tmp/ompi.HOST.UID ("mkdir ... File exists").
  mpirun_job() { mkdir -p "$tmp/ompi-$1"; JOB=$1 HOLD=$2 AFTER=$3 timeout -k 5 150 mpirun $root_flag --oversubscribe -np 2 \
    --mca orte_tmpdir_base "$tmp/ompi-$1" -x MASTER_ADDR=127.0.0.1 \
    -x MASTER_PORT="$port" -x BRAID_LOG_LEVEL=info -x BRAID_TIMEOUT -x BENCH -x ARGS -x D -x JOB -x HOLD -x AFTER \
    sh -c "$rank_script"; }
  mpirun_job first 1 "" >"$tmp/first.log" 2>&1 & first=$!
  { s=0; mpirun_job second none "$port" >"$tmp/second.log" 2>&1 || s=$?; touch "$tmp/second.done"; exit "$s"; } & second=$!
  wait_both "$first" "$second" "mpirun, both on MASTER_PORT $port"
  # One of the two stores found the port taken and moved on.
  cat "$tmp/first.log" "$tmp/second.log" | grep -q "so this job's store listens on" ||
    fail "neither mpirun job's store moved off MASTER_PORT $port: did the jobs not meet?"
else
  echo "launchers test: SKIP mpirun part: mpirun is not installed (openmpi-bin)"
fi

[ "$ran" -eq 1 ] || exit 77
echo "launchers test: ok"
