#!/bin/sh
# The GPU checks of issue 7, on a machine with an NVIDIA GPU, from the kit
# scripts/gpu_kit.sh made (.gpukit/gpukit.tar.xz in the working tree).
# Writes each log to $OUT (or ./gpu-logs) and a summary line per check.
# Groups: tests bench train torch sanitizer (default: all of them; a device
# command may run for 10 minutes, so name a few groups per call).
#   device run: carry [".gpukit"], command "sh scripts/gpu_check.sh tests"
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
groups="${*:-tests bench train torch sanitizer}"
want() { case " $groups " in *" $1 "*) return 0 ;; esac; return 1; }
check() {  # name, command...
  name=$1; shift
  if timeout 500 "$@" > "$out/$name.log" 2>&1; then echo "ok    $name"; else echo "FAIL  $name (exit $?)"; fi
  tail -3 "$out/$name.log"
}
L2="$B/braid-launch --nproc-per-node 2 --"  # unquoted where used: the kit path has no spaces

if want tests; then
  check kernels_cuda "$B/test_kernels_cuda" -s
  check trainer_device "$B/test_trainer_device" -s
  check comm_device "$B/test_comm_device" -s
fi
if want bench; then
  check bench_2 $L2 "$B/braid-bench" --device cuda -b 8 -e 256M -f 4 -n 10 -w 2 -c 1
  check bench_4 "$B/braid-launch" --nproc-per-node 4 -- "$B/braid-bench" --device cuda -b 8 -e 256M -f 16 -n 5 -w 1 -c 1
  for d in f16 bf16 f64 i8; do
    check "bench_2_$d" $L2 "$B/braid-bench" --device cuda -d $d -b 8 -e 16M -f 16 -n 2 -w 1 -c 1
  done
fi
# The trainer on the GPU (issue 7's targets): config B and a 113M-parameter
# config, one rank and two sharing the GPU; then PyTorch on the same shapes.
D="--data $kit/fortunes.txt --eval-interval 0 --eval-batches 1 --warmup-steps 2"
cfgB="--n-layer 6 --n-head 6 --n-embd 384 --block-size 256 --batch-size 8"
cfgL="--n-layer 16 --n-head 12 --n-embd 768 --block-size 1024 --batch-size 8"
if want train; then
  check train_B_1 "$B/braid-train" --device cuda $cfgB --steps 30 $D
  check train_B_cpu16 "$B/braid-train" --device cpu $cfgB --steps 4 --threads 16 $D
  check train_B_2ddp $L2 "$B/braid-train" --device cuda $cfgB --steps 30 $D
  check train_B_2tp $L2 "$B/braid-train" --device cuda $cfgB --steps 20 --tp 2 --grad-accum 2 $D
  check train_B_2pp $L2 "$B/braid-train" --device cuda $cfgB --steps 20 --pp 2 --grad-accum 4 $D
  check train_L_1 "$B/braid-train" --device cuda $cfgL --steps 12 $D
  check train_L_2zero3 $L2 "$B/braid-train" --device cuda $cfgL --steps 8 --strategy zero3 $D
fi
if want torch && python3 -c "import torch; assert torch.cuda.is_available()" 2> /dev/null; then
  check torch_B python3 "$kit/torch_gpt.py" $cfgB --steps 30
  check torch_B_naive python3 "$kit/torch_gpt.py" $cfgB --steps 30 --naive-attention
  check torch_L python3 "$kit/torch_gpt.py" $cfgL --steps 12
  check torch_L_naive python3 "$kit/torch_gpt.py" $cfgL --steps 12 --naive-attention
fi
if want sanitizer && command -v compute-sanitizer > /dev/null; then
  check memcheck compute-sanitizer --tool memcheck "$B/test_kernels_cuda"
  check racecheck compute-sanitizer --tool racecheck "$B/test_kernels_cuda"
fi
