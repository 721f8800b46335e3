#!/usr/bin/env bash
# tests/gpu/rehearse.sh: runs tests/gpu/run.sh as the GPU machine would, on a
# machine without one: in a chroot of a bare Debian 12 (a compiler, CMake,
# make and ninja, as the GPU image has, and none of this machine's packages),
# with the CUDA Toolkit bound in read-only, the working tree and .gpu-deps
# copied in, and no network (a new network namespace). What it shows: that
# the archive of make gpu-deps is all the build needs, that the script gets
# through every step, and how long each step takes (its summary.md).
#
#   make gpu-deps                       # .gpu-deps/deps.tar.gz
#   tests/gpu/rehearse.sh /work/gpu-chroot
#
# The chroot is made once beforehand with debootstrap (the command is printed
# when it is missing); this script downloads nothing. Results: gpu-results/ in the chroot's copy, and
# the summary on stdout. Needs root (chroot, mount, unshare). Environment:
# CLM_CUDA (default /usr/local/cuda), and run.sh's (CLM_GPU_BUILD_TIMEOUT
# etc.; on 2 cores the build needs far more than its default 420 s).
set -euo pipefail
root=${1:?usage: rehearse.sh CHROOT_DIR}
src=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cuda=$(readlink -f "${CLM_CUDA:-/usr/local/cuda}")
[ -x "$cuda/bin/nvcc" ] || { echo "rehearse.sh: no nvcc in $cuda/bin" >&2; exit 2; }
[ -f "$src/.gpu-deps/deps.tar.gz" ] || { echo "rehearse.sh: no .gpu-deps/deps.tar.gz (make gpu-deps)" >&2; exit 2; }
[ "$(id -u)" = 0 ] || { echo "rehearse.sh: needs root (chroot, mount, unshare)" >&2; exit 2; }

if [ ! -x "$root/usr/bin/g++" ]; then
  # This script fetches nothing: the chroot is made once, by hand, from the
  # Debian mirror apt already uses.
  echo "rehearse.sh: no bare Debian 12 in $root; make one first (as root):" >&2
  echo "  apt-get install debootstrap" >&2
  echo "  debootstrap --variant=minbase --include=build-essential,cmake,ninja-build,make bookworm $root" >&2
  exit 2
fi

# The working tree as a device run gets it: tracked and untracked files git
# does not ignore, plus the carried .gpu-deps.
rm -rf "$root/src"
mkdir -p "$root/src/.gpu-deps" "$root/usr/local/cuda"
(cd "$src" && git ls-files -z --cached --others --exclude-standard | xargs -0 cp --parents -t "$root/src")
cp "$src/.gpu-deps/deps.tar.gz" "$root/src/.gpu-deps/"

cleanup() {
  umount "$root/usr/local/cuda" 2>/dev/null || true
  umount "$root/proc" 2>/dev/null || true
  umount "$root/dev" 2>/dev/null || true
}
trap cleanup EXIT
mount --bind -o ro "$cuda" "$root/usr/local/cuda"
mount -t proc proc "$root/proc"
mount --bind /dev "$root/dev"

echo "rehearse.sh: tests/gpu/run.sh in $root, no network, CUDA from $cuda"
start=$(date +%s)
set +e
unshare --net chroot "$root" /usr/bin/env -i PATH=/usr/local/cuda/bin:/usr/bin:/bin HOME=/root \
  OUT=/src/gpu-results CLM_GPU_BUILD_TIMEOUT="${CLM_GPU_BUILD_TIMEOUT:-3600}" JOBS="${JOBS:-$(nproc)}" \
  bash -c 'cd /src && tests/gpu/run.sh'
code=$?
set -e
echo "rehearse.sh: run.sh exited $code after $(( $(date +%s) - start )) s; results in $root/src/gpu-results"
exit $code
