#!/bin/sh
# Installs braid's build dependencies from Debian's packages (only those
# missing, so a second run does nothing), then configures and builds into
# ./build. Safe to run any number of times.
set -eu
cd "$(dirname "$0")/.."

PACKAGES="meson ninja-build g++ pkg-config libboost-dev libspdlog-dev libfmt-dev catch2 \
libcli11-dev nlohmann-json3-dev libhwloc-dev libopenblas-dev libibverbs-dev libxxhash-dev fortunes iproute2"

missing=""
for p in $PACKAGES; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
if [ -n "$missing" ]; then
  echo "braid setup: installing$missing"
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -q
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q $missing
fi

if [ ! -f build/build.ninja ]; then
  meson setup build
fi
ninja -C build
