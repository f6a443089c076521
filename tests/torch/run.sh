#!/bin/sh
# Runs one torch backend test script on N ranks under a launcher.
#
# usage: run.sh LAUNCHER N SCRIPT BRAID_LAUNCH PYTHON_DIR PYTHON
#   LAUNCHER     torchrun | braid-launch
#   BRAID_LAUNCH the braid-launch binary of this build
#   PYTHON_DIR   the build's python/ folder (the braid_torch package)
#   PYTHON       Debian's interpreter, which has python3-torch
# Exits 77 (skip) only when that interpreter has no torch, i.e. where
# python3-torch is not installed (scripts/setup.sh installs it).
set -eu
launcher=$1
nproc=$2
script=$3
braid_launch=$4
python_dir=$5
python=$6
here=$(dirname "$0")

if ! "$python" -c 'import torch.distributed' 2>/dev/null; then
  echo "SKIP: $python has no torch (python3-torch is not installed; scripts/setup.sh installs it)"
  exit 77
fi
if ! ls "$python_dir"/braid_torch/_C*.so >/dev/null 2>&1; then
  echo "FAIL: the braid_torch extension was not built although $python has torch:" \
       "install libtorch-dev and pybind11-dev (scripts/setup.sh) and reconfigure (meson setup --reconfigure)"
  exit 1
fi

export PYTHONPATH="$python_dir${PYTHONPATH:+:$PYTHONPATH}"
export BRAID_TIMEOUT=${BRAID_TIMEOUT:-60}
export OMP_NUM_THREADS=1
case $launcher in
  torchrun)
    port=$("$python" "$here/../install/free_ports.py")
    # --redirects/--tee name a local rank that does not exist: Debian's
    # torchrun 1.13 on Python 3.11 fails at start on their default "0".
    exec timeout -k 10 170 "$python" -m torch.distributed.run --nnodes 1 --nproc_per_node "$nproc" \
      --master_addr 127.0.0.1 --master_port "$port" --redirects 9:1 --tee 9:1 "$script" ;;
  braid-launch)
    exec timeout -k 10 170 "$braid_launch" --nproc-per-node "$nproc" --timeout 160 -- "$python" "$script" ;;
  *)
    echo "run.sh: unknown launcher '$launcher' (torchrun or braid-launch)" >&2
    exit 2 ;;
esac
