#!/usr/bin/env bash
# An aarch64 Debian 12 sysroot holding CPython 3.11 and its headers, made without running any
# aarch64 code (debootstrap's first stage, then the packages unpacked), and beside it the
# aarch64 wheels of rase's test dependencies. qemu-aarch64-static -L DIR DIR/usr/bin/python3.11
# then runs Python as an aarch64 machine would; aarch64-linux-gnu-gcc builds against DIR's headers.
#   bash tools/aarch64-sysroot.sh DIR    (DIR/root: the sysroot, DIR/site: the packages)
set -euo pipefail
dir=$(realpath -m "$1")
[ -f "$dir/ok" ] && exit 0
rm -rf "$dir" && mkdir -p "$dir"
debootstrap=$(command -v debootstrap || echo /usr/sbin/debootstrap)
"$debootstrap" --foreign --arch=arm64 --variant=minbase --include=python3.11,libpython3.11-dev,python3.11-dev \
    bookworm "$dir/root" http://deb.debian.org/debian >"$dir/debootstrap.log"
for deb in "$dir"/root/var/cache/apt/archives/*.deb; do dpkg-deb -x "$deb" "$dir/root"; done
# the cross compiler's OpenMP runtime, where the emulated loader looks
cp /usr/aarch64-linux-gnu/lib/libgomp.so.1* "$dir/root/usr/lib/aarch64-linux-gnu/"
py=$(dirname "$0")/../.venv/bin/python
[ -x "$py" ] || py=python3
"$py" -m pip install -q --target "$dir/site" --only-binary :all: --implementation cp --python-version 3.11 --abi cp311 \
    $(for v in 17 24 26 27 28 31 34 35 36; do echo --platform manylinux_2_${v}_aarch64; done) --platform manylinux2014_aarch64 \
    numpy pytest gguf "tokenizers>=0.19" "huggingface_hub>=0.23" "jinja2>=3.1" tomli-w "llguidance>=1.9,<2" 2>&1 | { grep -v "^WARNING: Location" || true; }
touch "$dir/ok"
