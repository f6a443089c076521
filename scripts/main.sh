#!/bin/sh
# Sets everything up (scripts/setup.sh) and runs braid's main job: an
# all-reduce benchmark on 2 ranks started by braid-launch.
set -eu
cd "$(dirname "$0")/.."
./scripts/setup.sh
exec ./build/tools/braid-launch --nproc-per-node 2 -- \
  ./build/tools/braid-bench --coll all_reduce -b 8 -e 64M -f 4 "$@"
