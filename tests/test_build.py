"""The build: portable dispatch, the ISA and prefetch distance chosen at import, and the
RASE_SIMD / RASE_PREFETCH overrides."""
from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import rase
from rase.kernels import _kernels


def _build_info_with(env_value: str | None, var: str = "RASE_SIMD") -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env.pop(var, None)
    if env_value is not None:
        env[var] = env_value
    code = "import json, rase; print(json.dumps(rase.build_info()))"
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)


def _best_isa_from_cpuinfo() -> str:
    """What /proc/cpuinfo says the CPU has (read independently of rase's own detection)."""
    flags = Path("/proc/cpuinfo").read_text().split()
    if not all(f in flags for f in ("avx2", "fma", "f16c")):
        return "scalar"
    if all(f in flags for f in ("avx512f", "avx512bw", "avx512vl", "avx512_vnni")):
        return "avx512"
    return "avx2"


def test_build_info_reports_compiler_openmp_and_isas():
    info = rase.build_info()
    assert info["compiler"].startswith(("gcc", "clang"))
    assert info["openmp"] >= 201107  # OpenMP 3.1 or newer
    assert info["isa_compiled"] == ["scalar", "avx2", "avx512"]
    assert info["version"] == rase.__version__


def test_default_isa_is_the_best_the_cpu_supports():
    info = json.loads(_build_info_with(None).stdout)
    assert info["isa_selected"] == _best_isa_from_cpuinfo()


def test_rase_simd_picks_any_supported_level():
    for isa in _kernels.isa_supported():
        assert json.loads(_build_info_with(isa).stdout)["isa_selected"] == isa


def test_rase_simd_scalar_forces_the_reference_path():
    info = json.loads(_build_info_with("scalar").stdout)
    assert info["isa_selected"] == "scalar"


def test_unusable_rase_simd_is_a_typed_error():
    # an unknown name, and any level this CPU lacks (avx512 on the AVX2 machine kind)
    lacking = [i for i in ("avx2", "avx512") if i not in _kernels.isa_supported()]
    for name in ["neon", *lacking]:
        proc = _build_info_with(name)
        assert proc.returncode != 0 and "BackendUnavailable" in proc.stderr and "RASE_SIMD" in proc.stderr, name


def _vendor_from_cpuinfo() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("vendor_id"):
            return line.split(":", 1)[1].strip()
    return ""


def test_default_prefetch_distance_follows_the_cpu_vendor():
    vendor = _vendor_from_cpuinfo()
    assert _kernels.cpu_vendor() == vendor  # cpuid read right (cpuinfo is the kernel's copy)
    want = {"AuthenticAMD": 4096, "GenuineIntel": 4096}.get(vendor, 4096)
    assert _kernels.prefetch_default() == want
    info = json.loads(_build_info_with(None, "RASE_PREFETCH").stdout)
    assert (info["cpu_vendor"], info["prefetch_bytes"]) == (vendor, want)


def test_rase_prefetch_overrides_the_default_and_bad_values_are_typed_errors():
    for value in ("0", "2048", "4096"):
        assert json.loads(_build_info_with(value, "RASE_PREFETCH").stdout)["prefetch_bytes"] == int(value)
    for value in ("abc", "100", "-64", str(1 << 20)):
        proc = _build_info_with(value, "RASE_PREFETCH")
        assert proc.returncode != 0 and "BackendUnavailable" in proc.stderr and "RASE_PREFETCH" in proc.stderr, value


def test_no_cpu_specific_flags_in_the_build():
    tree = ast.parse((Path(__file__).parent.parent / "setup.py").read_text())
    flags = [node.value for node in ast.walk(tree)
             if isinstance(node, ast.Constant) and isinstance(node.value, str)
             and node.value.startswith("-")]
    assert "-O3" in flags and "-fopenmp" in flags
    assert "-Wunused-function" in flags and "-Wno-unused-function" not in flags  # no kernel hides unused
    assert not [f for f in flags if f.startswith(("-march", "-mtune", "-mavx", "-mfma", "-mf16c"))]


def test_set_prefetch_round_trip():
    before = _kernels.get_prefetch()
    try:
        _kernels.set_prefetch(1024)
        assert _kernels.get_prefetch() == 1024
        with pytest.raises(ValueError):
            _kernels.set_prefetch(100)
        assert _kernels.get_prefetch() == 1024
    finally:
        _kernels.set_prefetch(before)


def test_set_isa_round_trip():
    before = _kernels.get_isa()
    try:
        _kernels.set_isa("scalar")
        assert _kernels.get_isa() == "scalar"
    finally:
        _kernels.set_isa(before)


def test_a_regular_install_carries_every_module(tmp_path):
    """The README's first command is a regular (non-editable) install: build and install the
    tree into a folder and import every module from there, away from the source tree. The
    build warns of unused functions and prints no such warning."""
    import shutil

    root = Path(__file__).resolve().parents[1]
    src, target = tmp_path / "src", tmp_path / "site"  # a copy: no stale build/ can fill the gaps
    shutil.copytree(root, src, ignore=shutil.ignore_patterns(
        "build", ".venv", ".git", "tests", "benchmarks", "*.so", "*.egg-info", "__pycache__", "_kernels.c"))
    pip = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-v", "--target", str(target),
                          str(src)], capture_output=True, text=True, timeout=900)
    assert pip.returncode == 0, pip.stderr[-3000:]
    log = pip.stdout + pip.stderr  # -v: the compiler's command lines and diagnostics
    assert "-Wunused-function" in log and "[-Wunused-function]" not in log  # enabled, and nothing unused
    modules = sorted(".".join(p.relative_to(root).with_suffix("").parts)
                     for p in (root / "rase").rglob("*.py") if p.name != "__main__.py")
    # every module must come from the install (an editable install's finder would mask a gap)
    code = ("import importlib, rase, sys; "
            f"files = [importlib.import_module(m).__file__ for m in {modules!r} + ['rase.kernels._kernels']]; "
            "outside = [f for f in files if not f.startswith(sys.argv[1])]; "
            "assert not outside, outside; print(rase.build_info()['isa_selected'])")
    env = dict(os.environ, PYTHONPATH=str(target))
    out = subprocess.run([sys.executable, "-c", code, str(target)], capture_output=True, text=True, env=env,
                         cwd=tmp_path, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip() in _kernels.isa_names()


def test_the_package_top_level_is_its_wings_and_a_few_modules():
    """rase/ holds the folders of the data path and at most ~10 modules of its own (the surfaces
    and what every layer shares), not a flat folder of everything."""
    root = Path(__file__).resolve().parents[1] / "rase"
    wings = {p.name for p in root.iterdir() if (p / "__init__.py").exists()}
    modules = {p.name for p in root.glob("*.py")}
    assert wings == {"kernels", "store", "models", "text", "engine", "session", "server", "convert", "integrations",
                     "media"}
    assert len(modules) <= 10 and {"__init__.py", "api.py", "cli.py", "errors.py"} <= modules, sorted(modules)
    assert not list(root.glob("*.h")) and not list(root.glob("*.pyx"))  # the C wing is rase/kernels/
