#!/bin/sh
# Installs braid from BUILD_DIR into a temporary DESTDIR, builds CLIENT_CC
# (a program outside the tree) exactly as a user would:
#   c++ -std=c++20 client.cc $(pkg-config --cflags --libs braid)
# checks that neither it nor the installed libraries need the CUDA runtime or
# libibverbs at load time, then runs it under the installed braid-launch (3 ranks), under
# torchrun and under Open MPI's mpirun (2 ranks each). The installed files stand in a DESTDIR, so
# pkg-config gets PKG_CONFIG_SYSROOT_DIR and the programs LD_LIBRARY_PATH,
# as for any staged install.
#
# usage: run.sh BUILD_DIR CLIENT_CC    (MESON: the meson command)
set -eu
build=$1
client_src=$2
here=$(dirname "$0")
meson=${MESON:-meson}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/braid-install.XXXXXX")
trap 'rm -rf "$tmp"' EXIT INT TERM

fail() { echo "install test: $*" >&2; exit 1; }

"$meson" install -C "$build" --no-rebuild --quiet --destdir "$tmp/root" >"$tmp/install.log" 2>&1 ||
  fail "meson install failed: $(cat "$tmp/install.log")"
pc=$(find "$tmp/root" -name braid.pc | head -n 1)
[ -n "$pc" ] || fail "meson install wrote no braid.pc"
libdir=$(dirname "$(dirname "$pc")")
launch=$(find "$tmp/root" -path '*/bin/braid-launch' | head -n 1)
[ -n "$launch" ] || fail "meson install wrote no bin/braid-launch"
for h in braid communicator config dtype errors rank_info types work; do
  [ -n "$(find "$tmp/root" -path "*/include/braid/$h.h")" ] || fail "include/braid/$h.h not installed"
done
ls "$libdir"/libbraid_comm.so* >/dev/null || fail "no libbraid_comm.so in $libdir"

cp "$client_src" "$tmp/client.cc"
flags=$(PKG_CONFIG_PATH=$(dirname "$pc") PKG_CONFIG_SYSROOT_DIR="$tmp/root" pkg-config --cflags --libs braid)
echo "install test: c++ -std=c++20 client.cc $flags"
# shellcheck disable=SC2086  # the flags are words, as in the README's command line
c++ -std=c++20 "$tmp/client.cc" $flags -o "$tmp/client"
# braid.pc names no -std (it overrode a newer one the program chose), and
# an older one is refused by name, not with errors of the headers' types.
echo "$flags" | grep -q -- '-std=' && fail "braid.pc sets a language standard: $flags"
# shellcheck disable=SC2086
if c++ -std=c++17 -fsyntax-only "$tmp/client.cc" $flags >"$tmp/cxx17.log" 2>&1; then
  fail "C++17 compiled the client"
fi
grep -q "braid's headers need C++20" "$tmp/cxx17.log" || fail "C++17 was not refused by name: $(head -5 "$tmp/cxx17.log")"

# A host-only client of a CUDA build loads no CUDA runtime: neither it nor
# the libraries it links name one (comm loads its CUDA part at run time).
needed=$(for f in "$tmp/client" "$libdir"/libbraid_comm.so "$libdir"/libbraid_runtime.so "$libdir"/libbraid_kernels.so; do
  readelf -d "$f" | grep NEEDED; done)
if echo "$needed" | grep -Ei 'cudart|cublas|libcuda'; then fail "the client or a braid library needs CUDA at load time"; fi
# Nor libibverbs: the RDMA transport is a library of its own, installed
# beside libbraid_comm and loaded from there at run time
# (comm/transport/ibverbs/plugin.h).
if echo "$needed" | grep -i 'libibverbs'; then fail "the client or a braid library needs libibverbs at load time"; fi
if [ -e "$build/comm/libbraid_comm_ibverbs.so" ] && [ ! -e "$libdir/libbraid_comm_ibverbs.so" ]; then
  fail "no libbraid_comm_ibverbs.so beside libbraid_comm.so in $libdir"
fi

export LD_LIBRARY_PATH="$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export BRAID_TIMEOUT=30

# The torch backend, where this build has it: the installed package
# imports and registers "braid" with torch.distributed.
ext=$(find "$tmp/root" -path '*/braid_torch/_C*.so' | head -n 1)
if [ -n "$ext" ]; then
  (cd "$tmp" && PYTHONPATH=$(dirname "$(dirname "$ext")") /usr/bin/python3 -c \
    'import braid_torch, torch.distributed as d; assert "BRAID" in d.Backend._plugins; print("install test: braid_torch registers braid")') ||
    fail "the installed braid_torch does not import"
fi

out=$(timeout 60 "$launch" --nproc-per-node 3 --timeout 50 -- "$tmp/client" 2>&1) || fail "under braid-launch: $out"
echo "$out"
[ "$(echo "$out" | grep -c 'correct')" -eq 3 ] || fail "under braid-launch, not every rank reported correct results"

torchrun=$(command -v torchrun || true)
[ -n "$torchrun" ] || { echo "install test: SKIP torchrun part: torchrun not installed (python3-torch; scripts/setup.sh installs it)"; exit 77; }
port=$(python3 "$here/free_ports.py")
# --redirects/--tee name a local rank that does not exist: Debian's torchrun
# 1.13 on Python 3.11 fails at start on their default "0" (Std.from_str
# returns None: 3.11 no longer iterates an IntFlag's zero member).
out=$(timeout 90 "$torchrun" --nnodes 1 --nproc_per_node 2 --master_addr 127.0.0.1 --master_port "$port" \
  --redirects 9:1 --tee 9:1 --no_python "$tmp/client" 2>&1) || fail "under torchrun: $out"
echo "$out"
[ "$(echo "$out" | grep -c 'correct')" -eq 2 ] || fail "under torchrun, not every rank reported correct results"

# Open MPI: ranks from OMPI_COMM_WORLD_*, rank 0 serves braid's store at
# MASTER_ADDR:MASTER_PORT (runtime/rank_info.h).
mpirun=$(command -v mpirun || true)
[ -n "$mpirun" ] || { echo "install test: SKIP mpirun part: mpirun not installed (openmpi-bin; scripts/setup.sh installs it)"; exit 77; }
root_flag=""
[ "$(id -u)" -ne 0 ] || root_flag="--allow-run-as-root"
port=$(python3 "$here/free_ports.py")
out=$(timeout 90 "$mpirun" $root_flag --oversubscribe -np 2 -x MASTER_ADDR=127.0.0.1 -x MASTER_PORT="$port" \
  -x LD_LIBRARY_PATH -x BRAID_TIMEOUT "$tmp/client" 2>&1) || fail "under mpirun: $out"
echo "$out"
[ "$(echo "$out" | grep -c 'correct')" -eq 2 ] || fail "under mpirun, not every rank reported correct results"
echo "install test: ok"
