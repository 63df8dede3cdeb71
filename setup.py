"""Builds rase._kernels. Portable: no -march; AVX2 code uses per-function target attributes.

With SIMDe's headers (Debian's libsimde-dev; RASE_SIMDE_INCLUDE names another include dir) it also
builds rase._kernels_emu, the same module with every intrinsic emulated in portable C, which the
tests use to check the AVX-512 kernels on CPUs without AVX-512 (tools/install-test-deps.sh)."""
import os
from glob import glob

from Cython.Build import cythonize
from setuptools import Extension, setup

DEPENDS = sorted(glob("rase/*.h") + glob("rase/*.pxi")) + ["rase/_kernels.pxd", "rase/_kernels.pyx"]  # a header edit rebuilds
# -ffp-contract=off: the scalar reference and the SIMD paths round identically unless a kernel
# asks for an FMA explicitly.
FLAGS = ["-fopenmp", "-ffp-contract=off", "-fno-math-errno", "-Wunused-function"]
exts = [Extension("rase._kernels", sources=["rase/_kernels.pyx"], depends=DEPENDS, include_dirs=["rase"],
                  extra_compile_args=["-O3"] + FLAGS, extra_link_args=["-fopenmp"])]

simde = os.environ.get("RASE_SIMDE_INCLUDE", "/usr/include")
if os.path.exists(os.path.join(simde, "simde", "x86", "avx512.h")) and not os.environ.get("RASE_NO_EMU"):  # wheels: none
    exts.append(Extension("rase._kernels_emu", sources=["rase/_kernels_emu.pyx"], depends=DEPENDS,
                          include_dirs=["rase", simde], define_macros=[("RASE_EMULATE_SIMD", "1")],
                          extra_compile_args=["-O1"] + FLAGS, extra_link_args=["-fopenmp"]))

setup(ext_modules=cythonize(exts, compiler_directives={"language_level": "3"}))
