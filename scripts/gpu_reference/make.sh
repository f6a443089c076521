#!/bin/sh
# Makes the CPU runs that scripts/gpu_check.sh sets the GPU training runs
# beside (issue 19), here, so that the device's time goes to the GPU: config
# B for 10 and 30 steps and the 113M-parameter config for 3 (about 5 minutes
# on 2 cores), with the flags gpu_check.sh gives the GPU runs, on the corpus
# the kit brings. Config B gave the same losses on 1 and 2 threads (sgemm
# splits no dot product: kernels/cpu/matmul.cc); group cpuref of gpu_check.sh
# sets a run on the device's cores beside these.
# Rerun where gpu_kit.sh says they are stale (the trainer or the kernels
# changed since the commit README names).
set -eu
cd "$(dirname "$0")/../.."
./scripts/setup.sh > /dev/null
out=scripts/gpu_reference
corpus=$(mktemp)
trap 'rm -f "$corpus"' EXIT
find /usr/share/games/fortunes -maxdepth 1 -type f ! -name '*.*' | sort | xargs cat > "$corpus"
D="--data $corpus --eval-interval 0 --eval-batches 1 --warmup-steps 2"
cfgB="--n-layer 6 --n-head 6 --n-embd 384 --block-size 256 --batch-size 8"
cfgL="--n-layer 16 --n-head 12 --n-embd 768 --block-size 1024 --batch-size 8"
T=build/tools/braid-train
run() {  # name, flags...
  name=$1; shift
  rm -f "$out/$name.jsonl"
  # shellcheck disable=SC2086
  $T --device cpu "$@" --grad-accum 2 $D --metrics "$out/$name.jsonl" > /dev/null
}
# shellcheck disable=SC2086
run cpu_B10 $cfgB --steps 10
# shellcheck disable=SC2086
run cpu_B30 $cfgB --steps 30
# shellcheck disable=SC2086
run cpu_L3 $cfgL --steps 3 --lr 6e-4
commit=$(git rev-parse --short HEAD)
dirty=$(git diff --quiet HEAD -- trainer kernels tools && echo "" || echo " (with uncommitted changes)")
cat > "$out/README" <<END
made at $commit$dirty by scripts/gpu_reference/make.sh on $(nproc) cores, $(date -u +%Y-%m-%d)
The CPU runs gpu_check.sh sets the GPU training runs beside (--metrics files, rank 0's):
  cpu_B10  config B, 10 steps, --grad-accum 2 (the 2- and 4-rank runs of group train)
  cpu_B30  config B, 30 steps, --grad-accum 2 (train1)
  cpu_L3   the 113M-parameter config, 3 steps, --grad-accum 2, --lr 6e-4 (trainLall)
END
cat "$out/README"
