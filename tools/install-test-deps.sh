#!/usr/bin/env bash
# What the test suite needs from the system, from Debian's packages: chromium and chromium-driver
# (the headless browser tests/server/test_web.py drives) and libsimde-dev (SIMDe's headers, from which
# setup.py builds rase.kernels._kernels_emu, so tests/kernels/test_kernels_emu.py checks the AVX-512 kernels on
# any CPU). Run it before installing rase. Elsewhere: any Chromium and its chromedriver
# (RASE_CHROMIUM / RASE_CHROMEDRIVER) and SIMDe 0.7's headers (RASE_SIMDE_INCLUDE: their include dir).
# And for tests/test_aarch64.py (rase built for aarch64, run under emulation): Debian's cross
# compiler gcc-aarch64-linux-gnu with the cross C library's headers libc6-dev-arm64-cross (a
# Recommends of the compiler, which --no-install-recommends leaves out), qemu-user-static and
# debootstrap (tools/aarch64-sysroot.sh). Checked from an empty Debian 12 userland:
# tools/check-fresh-deps.sh.
set -euo pipefail
need=()
command -v chromium >/dev/null && command -v chromedriver >/dev/null || need+=(chromium chromium-driver)
[ -f /usr/include/simde/x86/avx512.h ] || need+=(libsimde-dev)
command -v aarch64-linux-gnu-gcc >/dev/null || need+=(gcc-aarch64-linux-gnu)
[ -f /usr/aarch64-linux-gnu/include/bits/libc-header-start.h ] || need+=(libc6-dev-arm64-cross)
command -v qemu-aarch64-static >/dev/null || need+=(qemu-user-static)
command -v debootstrap >/dev/null || [ -x /usr/sbin/debootstrap ] || need+=(debootstrap)
[ ${#need[@]} -eq 0 ] && exit 0
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
$sudo apt-get update -qq
$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
command -v chromium >/dev/null && chromium --version
test -f /usr/include/simde/x86/avx512.h
