#!/bin/sh
# Packs what the GPU checks need into .gpukit/gpukit.tar.xz, for a machine
# with an NVIDIA GPU but none of Debian's -dev packages (the device machine
# lent to some sessions): the CUDA test and tool binaries of ./build (built
# here, with CUDA) and the shared libraries they use, except glibc's and the
# CUDA driver's and cuBLAS (found there; scripts/gpu_check.sh looks them up).
# Also the default corpus, scripts/torch_gpt.py and the CPU references. Carry .gpukit and run
# scripts/gpu_check.sh there.
set -eu
cd "$(dirname "$0")/.."
./scripts/setup.sh > /dev/null
[ -x build/tests/comm/test_comm_device ] || { echo "gpu_kit: this build has no CUDA (nvcc not found)" >&2; exit 2; }
kit=.gpukit/stage
rm -rf .gpukit
mkdir -p "$kit/bin" "$kit/lib"
bins="build/tests/kernels/test_kernels_cuda build/tests/comm/test_comm_device build/tests/comm/test_comm
      build/tests/trainer/test_trainer_device build/tools/braid-launch build/tools/braid-bench build/tools/braid-train"
for b in $bins; do cp "$b" "$kit/bin/"; done
for b in $bins; do
  ldd "$b" | awk '/=> \// {print $3}'
done | sort -u | while read -r lib; do
  case "$(basename "$lib")" in
    libc.so*|libm.so*|libdl.so*|libpthread.so*|librt.so*|ld-linux*|libcuda.so*|libcublas*) ;;
    *) cp -L "$lib" "$kit/lib/" ;;
  esac
done
# The CUDA part of the library is a plugin, loaded from beside libbraid_comm
# at the first device buffer: ldd does not list it.
cp -L build/comm/libbraid_comm_cuda.so "$kit/lib/"
# The probes, for the H100/H200 (sm_90).
probe="nvcc -std=c++20 -I. -Iinclude -gencode=arch=compute_90,code=sm_90"
# Whether another process's kernels run while a stream is held at a gate.
$probe -o "$kit/bin/cuda_gate_probe" scripts/cuda_gate_probe.cu kernels/cuda/reduce.cu
# Other ways to write the 2-rank all_reduce's kernel, timed against the copy.
$probe -o "$kit/bin/reduce_sweep" scripts/reduce_sweep.cu kernels/cuda/reduce.cu
# 2 and 4 processes doing that all_reduce: IPC event waits against flags in the kernel.
$probe -o "$kit/bin/allreduce_wait_probe" scripts/allreduce_wait_probe.cu
cp scripts/gpu_check.sh scripts/torch_gpt.py "$kit/"
# The CPU runs the GPU training runs must match (scripts/gpu_reference),
# stale where the trainer or the CPU's kernels changed since they were made
# (kernels/cuda/ does not take part in a CPU run).
mkdir -p "$kit/reference"
cp scripts/gpu_reference/README scripts/gpu_reference/*.jsonl "$kit/reference/"
made=$(awk 'NR == 1 {print $3}' scripts/gpu_reference/README)
if ! git diff --quiet "$made" -- trainer kernels ':(exclude)kernels/cuda' tools/braid_train.cc tools/train; then
  echo "gpu_kit: the CPU references are stale (trainer or kernels changed since $made):" \
    "run scripts/gpu_reference/make.sh, or group cpuref of gpu_check.sh on the device" >&2
  echo "stale: the trainer or the kernels changed after $made" >> "$kit/reference/README"
  sed -i '1s/$/ -- STALE (gpu_kit.sh)/' "$kit/reference/README"
fi
# The default corpus, as braid-train reads it (the files without an
# extension, sorted), in one file for --data: that machine has no fortunes.
find /usr/share/games/fortunes -maxdepth 1 -type f ! -name '*.*' | sort | xargs cat > "$kit/fortunes.txt"
tar -C "$kit" -cJf .gpukit/gpukit.tar.xz .
rm -rf "$kit"
ls -l .gpukit/gpukit.tar.xz
