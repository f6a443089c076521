#!/bin/sh
# The GPU checks of issue 7, on a machine with an NVIDIA GPU, from the kit
# scripts/gpu_kit.sh made (.gpukit/gpukit.tar.xz in the working tree).
# Writes each log to $OUT (or ./gpu-logs) and a summary line per check.
#   device run: carry [".gpukit"], command "sh scripts/gpu_check.sh"
set -u
cd "$(dirname "$0")/.."
out="${OUT:-gpu-logs}"
mkdir -p "$out"
kit=/tmp/braid-gpukit
rm -rf "$kit" && mkdir -p "$kit" && tar -C "$kit" -xJf .gpukit/gpukit.tar.xz || exit 2
cublas="$(find /opt /usr/local /usr/lib -name 'libcublas.so.13' 2>/dev/null | head -1)"
export LD_LIBRARY_PATH="$kit/lib${cublas:+:$(dirname "$cublas")}"
nvidia-smi > "$out/nvidia-smi.log" 2>&1
B="$kit/bin"
check() {  # name, command...
  name=$1; shift
  if timeout 500 "$@" > "$out/$name.log" 2>&1; then echo "ok    $name"; else echo "FAIL  $name (exit $?)"; fi
  tail -3 "$out/$name.log"
}
check kernels_cuda "$B/test_kernels_cuda" -s
check comm_device "$B/test_comm_device" -s
check bench_2 "$B/braid-launch" --nproc-per-node 2 -- "$B/braid-bench" --device cuda -b 8 -e 256M -f 4 -n 10 -w 2 -c 1
check bench_4 "$B/braid-launch" --nproc-per-node 4 -- "$B/braid-bench" --device cuda -b 8 -e 256M -f 16 -n 5 -w 1 -c 1
for d in f16 bf16 f64 i8; do
  check "bench_2_$d" "$B/braid-launch" --nproc-per-node 2 -- "$B/braid-bench" --device cuda -d $d -b 8 -e 16M -f 16 -n 2 -w 1 -c 1
done
if command -v compute-sanitizer > /dev/null; then
  check memcheck compute-sanitizer --tool memcheck "$B/test_kernels_cuda"
  check racecheck compute-sanitizer --tool racecheck "$B/test_kernels_cuda"
fi
