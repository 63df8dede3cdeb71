"""Builds rase._kernels. Portable: no -march; AVX2 code uses per-function target attributes."""
from Cython.Build import cythonize
from setuptools import Extension, setup

ext = Extension(
    "rase._kernels",
    sources=["rase/_kernels.pyx"],
    depends=["rase/_simd.h", "rase/_bench.h", "rase/_quants.h", "rase/_dot.h", "rase/_repack.h", "rase/_pool.h", "rase/_attention.h", "rase/_attend_g.h", "rase/_forward.h", "rase/_sample.h", "rase/_kernels.pxd"],
    include_dirs=["rase"],
    # -ffp-contract=off: the scalar reference and the SIMD paths round identically unless a
    # kernel asks for an FMA explicitly.
    extra_compile_args=["-O3", "-fopenmp", "-ffp-contract=off", "-fno-math-errno", "-Wno-unused-function"],
    extra_link_args=["-fopenmp"],
)

setup(ext_modules=cythonize([ext], compiler_directives={"language_level": "3"}))
