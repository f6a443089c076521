#!/bin/sh
# Installs braid's build dependencies from Debian's packages (only those
# missing, so a second run does nothing), then configures and builds into
# ./build, and the binaries the RDMA VM tests run inside the VM into
# ./build-vm. Safe to run any number of times.
set -eu
cd "$(dirname "$0")/.."

PACKAGES="meson ninja-build g++ pkg-config libboost-dev libspdlog-dev libfmt-dev catch2 \
libcli11-dev nlohmann-json3-dev libhwloc-dev libopenblas-dev libibverbs-dev libxxhash-dev fortunes iproute2 \
qemu-system-x86 linux-image-amd64 busybox-static cpio rdma-core ibverbs-utils ibverbs-providers perftest \
python3-torch libtorch-dev pybind11-dev python3-pybind11 openmpi-bin libopenmpi-dev python3-matplotlib"
# The second line is the RDMA VM (tests/rdma, scripts/rdma_vm.sh): QEMU boots
# Debian's kernel, which has soft-RoCE, with the host's / as its root;
# installing linux-image-amd64 adds files under /boot and /lib/modules and
# does not change the running kernel.
# The last line is the torch.distributed backend (python/braid_torch) and
# its tests: Debian's PyTorch 1.13 for /usr/bin/python3, and pybind11;
# mpirun runs the installed-library test (tests/install) under Open MPI,
# and scripts/ompi_compare.sh builds its MPI benchmark with mpicc.

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

# Binaries that run inside the RDMA VM: TCG's `-cpu max` has no AVX-512, so
# no -march=native; only what the VM runs is built.
if [ ! -f build-vm/build.ninja ]; then
  meson setup build-vm -Dnative=false -Dtests=disabled -Dcuda=disabled
fi
tests/rdma/run.sh --build-only
