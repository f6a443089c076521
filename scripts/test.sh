#!/bin/sh
# Sets everything up (scripts/setup.sh) and runs the whole test suite.
set -eu
cd "$(dirname "$0")/.."
./scripts/setup.sh
meson test -C build --print-errorlogs --num-processes 1 "$@"
