#!/bin/sh
# Sets everything up (scripts/setup.sh) and runs braid's main job: a GPT
# trained data-parallel (ddp) on 2 ranks started by braid-launch, on the
# default corpus (the fortunes of Debian's `fortunes` package), ending with a
# text sample. Extra arguments go to braid-train.
set -eu
cd "$(dirname "$0")/.."
./scripts/setup.sh
exec ./build/tools/braid-launch --nproc-per-node 2 -- \
  ./build/tools/braid-train --strategy ddp --sample 300 "$@"
