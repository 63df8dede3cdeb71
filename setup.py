"""Builds rase.kernels._kernels. Portable: no -march; AVX2 code uses per-function target attributes.

SIMDe's headers (Debian's libsimde-dev; RASE_SIMDE_INCLUDE names another include dir) do two
things. On x86 they add rase.kernels._kernels_emu, the same module with every intrinsic emulated in
portable C, which the tests use to check the AVX-512 kernels on CPUs without AVX-512
(tools/install-test-deps.sh). On aarch64 they are what the NEON levels are built with (the AVX2
kernels mapped onto NEON, _simd.h): without them an aarch64 build has the scalar kernels only."""
import os
import sys
import sysconfig
from glob import glob

from Cython.Build import cythonize
from setuptools import Extension, setup

K = "rase/kernels"  # the C wing: the Cython module and its headers
DEPENDS = sorted(glob(f"{K}/*.h") + glob(f"{K}/*.pxi")) + [f"{K}/_kernels.pxd", f"{K}/_kernels.pyx"]  # a header edit rebuilds
# -ffp-contract=off: the scalar reference and the SIMD paths round identically unless a kernel
# asks for an FMA explicitly.
FLAGS = ["-fopenmp", "-ffp-contract=off", "-fno-math-errno", "-Wunused-function"]
simde = os.environ.get("RASE_SIMDE_INCLUDE", "/usr/include")
have_simde = os.path.exists(os.path.join(simde, "simde", "x86", "avx512.h"))
# the target (a cross build sets _PYTHON_HOST_PLATFORM: tools/build-wheels.sh); Linux only (getauxval)
arm = sysconfig.get_platform() == "linux-aarch64"
if arm and not have_simde:
    print("rase: SIMDe's headers not found (libsimde-dev, or RASE_SIMDE_INCLUDE): building the scalar "
          "kernels only, many times slower than NEON", file=sys.stderr)
exts = [Extension("rase.kernels._kernels", sources=[f"{K}/_kernels.pyx"], depends=DEPENDS,
                  include_dirs=[K] + ([simde] if arm and have_simde else []),
                  define_macros=[("RASE_SIMDE", "1")] if arm and have_simde else [],
                  extra_compile_args=["-O3"] + FLAGS, extra_link_args=["-fopenmp"])]

if have_simde and not arm and not os.environ.get("RASE_NO_EMU"):  # wheels: none
    exts.append(Extension("rase.kernels._kernels_emu", sources=[f"{K}/_kernels_emu.pyx"], depends=DEPENDS,
                          include_dirs=[K, simde], define_macros=[("RASE_EMULATE_SIMD", "1")],
                          extra_compile_args=["-O1"] + FLAGS, extra_link_args=["-fopenmp"]))

setup(ext_modules=cythonize(exts, compiler_directives={"language_level": "3"}))
