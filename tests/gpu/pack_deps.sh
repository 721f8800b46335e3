#!/usr/bin/env bash
# tests/gpu/pack_deps.sh: packs the Debian packages the CUDA build needs
# (Eigen, fmt, SQLite, hnswlib, Catch2, nlohmann-json, OpenSSL's libcrypto,
# hiredis, OpenCC with its dictionaries, ICU for examples/tokenizer) into
# .gpu-deps/deps.tar.gz, for a GPU machine that has CUDA and a compiler but no
# package registry (such a machine is lent bare, and nothing can be installed
# on it). tests/gpu/run.sh unpacks the archive into its build folder and
# builds against it when it is there.
#
#   tests/gpu/pack_deps.sh          # here, where apt-get reaches Debian
#   # ...carry .gpu-deps to the GPU machine with the working tree, then there:
#   tests/gpu/run.sh
#
# The packages are Debian 12's (x86-64): headers, the CMake package files and
# the shared libraries libfmt.so.9, libsqlite3.so.0, libcrypto.so.3,
# libhiredis.so.0.14, libopencc.so.1.1 and its libmarisa.so.0, ICU's
# libicu*.so.72 (found there through the build's RPATH), and OpenCC's data (share/opencc). redis-server is
# not packed: the GPU run builds and runs no Redis test. .gpu-deps/ is
# git-ignored.
set -euo pipefail

src=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
dest=$src/.gpu-deps
packages=(libeigen3-dev libfmt-dev libfmt9 libsqlite3-dev libsqlite3-0 libhnswlib-dev catch2 nlohmann-json3-dev
          libssl-dev libssl3 libhiredis-dev libhiredis0.14 libopencc-dev libopencc1.1 libopencc-data libmarisa0
          libicu-dev libicu72)

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/debs" "$work/root"
# As root, apt's download sandbox user cannot write to a mktemp folder: download as root.
(cd "$work/debs" && apt-get download -q -o APT::Sandbox::User=root "${packages[@]}")
for deb in "$work"/debs/*.deb; do
  dpkg-deb -x "$deb" "$work/root"
  dpkg-deb -f "$deb" Package Version | paste -sd' ' >>"$work/root/clm-gpu-deps.txt"
done
# What a build never reads: documentation, and the static libraries.
rm -rf "$work/root/usr/share/doc" "$work/root/usr/share/man" "$work/root/usr/lib/x86_64-linux-gnu/libsqlite3.a" \
  "$work/root/usr/lib/x86_64-linux-gnu/libcrypto.a" "$work/root/usr/lib/x86_64-linux-gnu/libssl.a" \
  "$work/root/usr/lib/x86_64-linux-gnu/libhiredis.a" "$work/root"/usr/lib/x86_64-linux-gnu/libicu*.a
mkdir -p "$dest"
tar -czf "$dest/deps.tar.gz.tmp" -C "$work/root" .
mv "$dest/deps.tar.gz.tmp" "$dest/deps.tar.gz"
echo "wrote $dest/deps.tar.gz ($(du -h "$dest/deps.tar.gz" | cut -f1)):"
sed 's/^/  /' "$work/root/clm-gpu-deps.txt"
