"""Builds rase._kernels. Portable: no -march; AVX2 code uses per-function target attributes."""
from glob import glob

from Cython.Build import cythonize
from setuptools import Extension, setup

ext = Extension(
    "rase._kernels",
    sources=["rase/_kernels.pyx"],
    depends=sorted(glob("rase/*.h")) + ["rase/_kernels.pxd"],  # a header edit rebuilds
    include_dirs=["rase"],
    # -ffp-contract=off: the scalar reference and the SIMD paths round identically unless a
    # kernel asks for an FMA explicitly.
    extra_compile_args=["-O3", "-fopenmp", "-ffp-contract=off", "-fno-math-errno", "-Wno-unused-function"],
    extra_link_args=["-fopenmp"],
)

setup(ext_modules=cythonize([ext], compiler_directives={"language_level": "3"}))
