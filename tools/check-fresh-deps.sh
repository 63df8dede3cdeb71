#!/usr/bin/env bash
# tools/install-test-deps.sh checked where nothing was installed before: an empty Debian 12
# userland (debootstrap, minbase) given only what a CI machine starts with (Python 3 with venv
# and headers, gcc, g++, git), then the script, then the build that needs the most of what it
# installs: the aarch64 wheel's cross build (tools/build-wheels.sh). Needs root, network, ~2 GB.
#   sudo bash tools/check-fresh-deps.sh [DIR]   (DIR: the chroot, kept for a rerun; default: a temp dir)
set -euo pipefail
cd "$(dirname "$0")/.."
dir=$(realpath -m "${1:-$(mktemp -d)}")
root=$dir/root
mkdir -p "$dir"
if [ ! -x "$root/bin/bash" ]; then
    debootstrap=$(command -v debootstrap || echo /usr/sbin/debootstrap)
    "$debootstrap" --variant=minbase bookworm "$root" http://deb.debian.org/debian >"$dir/debootstrap.log"
fi
cp /etc/resolv.conf "$root/etc/resolv.conf"
mountpoint -q "$root/proc" || mount -t proc proc "$root/proc"
mountpoint -q "$root/dev" || mount --bind /dev "$root/dev"
trap 'umount "$root/proc" "$root/dev" 2>/dev/null || true' EXIT
chroot "$root" /bin/bash -c 'apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
    --no-install-recommends python3 python3-venv python3-dev gcc g++ git ca-certificates >/dev/null'
# the host's own certificate authorities (a proxy's), so that pip reaches PyPI as the host does
cp -r /usr/local/share/ca-certificates/. "$root/usr/local/share/ca-certificates/"
chroot "$root" update-ca-certificates >/dev/null
rm -rf "$root/src" && git clone -q . "$root/src"  # what is committed: a fresh clone, as CI has
chroot "$root" /bin/bash -c 'cd /src && bash tools/install-test-deps.sh && python3 -m venv .venv \
    && RASE_WHEEL_ARCH=aarch64 RASE_WHEEL_DIR=/src/dist bash tools/build-wheels.sh .venv/bin/python \
    && ls dist/*manylinux_2_34_aarch64.whl'
echo "fresh Debian 12: install-test-deps.sh and the aarch64 wheel build passed"
