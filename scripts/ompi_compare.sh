#!/usr/bin/env bash
# Open MPI beside braid (issue 18): the same collective, sizes, rank counts
# and iteration counts, one after the other in one run, and the ratio.
#
#   scripts/ompi_compare.sh [--build build] [--ranks "2 4 8"] [--coll "all_reduce broadcast"]
#                           [-b 8] [-e 64K] [-f 4] [-n 2000] [-w 200] [--runs 5] [--nice 0] [--bind]
#
# For each rank count and collective it alternates, --runs times, braid-bench
# (braid-launch -n N, f32 sum, out of place, -c 0) and scripts/ompi_bench.c
# (MPI_Allreduce f32 sum out of place, or MPI_Bcast from rank 0, under
# `mpirun --oversubscribe`), each timing -n calls after -w warm-up ones and
# averaging over its ranks. It prints per size the median over the runs of
# each, braid / Open MPI, and braid's algorithm. Alternating runs spreads a
# busy machine's noise over both; more ranks than cores is what
# --oversubscribe is for (Open MPI then yields while it polls).
# --nice N runs both under `nice -n N` (negative needs root).
# --bind binds both alike, rank r to core r mod the cores (braid's ranks
# through taskset, Open MPI's with --map-by core --bind-to
# core:overload-allowed), so that neither depends on where the scheduler
# puts its ranks.
#
# Needs Open MPI's mpicc and mpirun (scripts/setup.sh installs openmpi-bin
# and libopenmpi-dev) and a built braid (tools/braid-bench, tools/braid-launch).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
build=build ranks="2 4 8" colls="all_reduce broadcast" min=8 max=64K factor=4 iters=2000 warmup=200 runs=5
niceness=0 bind=0
while [ $# -gt 0 ]; do
  case "$1" in
    --build) build=$2; shift 2 ;;
    --ranks) ranks=$2; shift 2 ;;
    --coll) colls=$2; shift 2 ;;
    -b) min=$2; shift 2 ;;
    -e) max=$2; shift 2 ;;
    -f) factor=$2; shift 2 ;;
    -n) iters=$2; shift 2 ;;
    -w) warmup=$2; shift 2 ;;
    --runs) runs=$2; shift 2 ;;
    --nice) niceness=$2; shift 2 ;;
    --bind) bind=1; shift ;;
    -h|--help) sed -n '2,25p' "$0"; exit 0 ;;
    *) echo "ompi_compare: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
case "$build" in /*) ;; *) build=$root/$build ;; esac

bytes_of() {  # 64K -> 65536
  local v=$1
  case "$v" in
    *K) echo $(( ${v%K} * 1024 )) ;;
    *M) echo $(( ${v%M} * 1024 * 1024 )) ;;
    *G) echo $(( ${v%G} * 1024 * 1024 * 1024 )) ;;
    *) echo "$v" ;;
  esac
}

for tool in mpicc mpirun; do
  command -v $tool > /dev/null || { echo "ompi_compare: $tool not found; run scripts/setup.sh (openmpi-bin, libopenmpi-dev)" >&2; exit 1; }
done
for tool in braid-bench braid-launch; do
  [ -x "$build/tools/$tool" ] || { echo "ompi_compare: $build/tools/$tool not built (ninja -C $build tools/$tool)" >&2; exit 1; }
done

tmp=$(mktemp -d /tmp/ompi_compare.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
mpicc -O2 -o "$tmp/ompi_bench" "$root/scripts/ompi_bench.c"

echo "# $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg); $(mpirun --version 2>&1 | head -1)"
echo "# -b $min -e $max -f $factor -n $iters -w $warmup, median of $runs alternating runs, nice $niceness," \
  "$([ "$bind" = 1 ] && echo "rank r bound to core r mod $(nproc)" || echo "unbound")"
braid_bind=() mpi_bind=()
if [ "$bind" = 1 ]; then
  # The core count from here: inside a rank nproc follows OMP_NUM_THREADS,
  # which braid-launch sets to 1. RANK is each rank's, expanded by its shell.
  braid_bind=(sh -c "exec taskset -c \"\$((RANK % $(nproc)))\" \"\$0\" \"\$@\"")
  mpi_bind=(--map-by core --bind-to core:overload-allowed)
fi
for n in $ranks; do
  for coll in $colls; do
    mpi_coll=allreduce
    [ "$coll" = broadcast ] && mpi_coll=bcast
    [ "$coll" = all_reduce ] || [ "$coll" = broadcast ] || { echo "ompi_compare: --coll all_reduce|broadcast" >&2; exit 2; }
    for run in $(seq "$runs"); do
      timeout 600 nice -n "$niceness" "$build/tools/braid-launch" -n "$n" -- "${braid_bind[@]}" "$build/tools/braid-bench" \
        --coll "$coll" -b "$min" -e "$max" -f "$factor" -n "$iters" -w "$warmup" -c 0 \
        --csv "$tmp/braid-$coll-$n-$run.csv" > "$tmp/braid.out" 2>&1 ||
        { echo "ompi_compare: braid-bench failed:" >&2; tail -20 "$tmp/braid.out" >&2; exit 1; }
      timeout 600 nice -n "$niceness" mpirun --oversubscribe --allow-run-as-root "${mpi_bind[@]}" -n "$n" "$tmp/ompi_bench" \
        "$mpi_coll" "$(bytes_of "$min")" "$(bytes_of "$max")" "$factor" "$iters" "$warmup" \
        > "$tmp/ompi-$coll-$n-$run.txt" 2> "$tmp/ompi.err" ||
        { echo "ompi_compare: ompi_bench failed:" >&2; tail -20 "$tmp/ompi.err" >&2; exit 1; }
    done
    python3 - "$tmp" "$coll" "$n" "$runs" <<'EOF'
import csv, statistics, sys
tmp, coll, n, runs = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
braid, ompi, algo = {}, {}, {}
for run in range(1, runs + 1):
    with open(f"{tmp}/braid-{coll}-{n}-{run}.csv") as f:
        for row in csv.DictReader(f):
            size = int(row["bytes"])
            braid.setdefault(size, []).append(float(row["oop_time_us"]))
            algo[size] = row["transport"] + ":" + row["algorithm"]
    with open(f"{tmp}/ompi-{coll}-{n}-{run}.txt") as f:
        for line in f:
            size, us = line.split()
            ompi.setdefault(int(size), []).append(float(us))
print(f"# {coll} on {n} ranks (time per call in us, medians)")
print(f"{'bytes':>10} {'braid':>10} {'open_mpi':>10} {'ratio':>7}  braid algorithm")
for size in sorted(braid):
    b = statistics.median(braid[size])
    o = statistics.median(ompi.get(size, [float("nan")]))
    print(f"{size:>10} {b:>10.2f} {o:>10.2f} {b / o:>7.2f}  {algo[size]}")
EOF
  done
done
echo "# load average at the end $(cut -d' ' -f1-3 /proc/loadavg)"
