"""rase on aarch64, emulated: the release wheel cross-built for aarch64 (tools/build-wheels.sh with
RASE_WHEEL_ARCH=aarch64: Debian's gcc-aarch64-linux-gnu against an aarch64 CPython 3.11,
tools/aarch64-sysroot.sh), installed as pip installs it for that platform, then run by
qemu-aarch64 as three CPUs: qemu's "max" (the dot-product and int8 matrix-multiply
instructions), a Neoverse N1 (Graviton2: dotprod, no i8mm) and a Cortex-A57 (ARMv8.0: NEON
only). On each: the levels it reports, the kernel smoke test, the kernels' test suite, every
tiny family against llama.cpp's one-token fixtures (tests/models/test_archs.py, tests/models/test_gpt_oss.py),
and SmolLM2's logits against the x86 build's: the same bits on every level (scalar: x86's scalar path; neon, dotprod, i8mm: x86's AVX2 path)."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]
TAG = "manylinux_2_34_aarch64"
CPUS = {"max": ["scalar", "neon", "dotprod", "i8mm"], "neoverse-n1": ["scalar", "neon", "dotprod"],
        "cortex-a57": ["scalar", "neon"]}  # qemu -cpu: the levels it runs
TOKENS = "1 504 3575 282 4648 314 3593 30 1070 314 216"
# every position's logits after the prompt, then 8 greedy decode steps timed (emulation speed: a
# ratio between levels only, never a product figure)
LOGITS = """
import sys, time, numpy as np
from rase import _kernels
_kernels.set_isa(sys.argv[4])
from rase.engine.decoder import load_gguf_decoder
dec = load_gguf_decoder(None, sys.argv[1], n_ctx=64, n_threads=2)
logits = dec.prefill([int(t) for t in sys.argv[3].split()], all_logits=True)
np.save(sys.argv[2], logits)
t0, token = time.perf_counter(), int(np.argmax(logits[-1]))
for _ in range(8):
    token = int(np.argmax(dec.decode(token)))
print(8 / (time.perf_counter() - t0))
"""


@pytest.fixture(scope="module")
def aarch64(tmp_path_factory):
    """(sysroot, the wheel, a directory holding the wheel installed beside its dependencies' site)."""
    for tool in ("aarch64-linux-gnu-gcc", "qemu-aarch64-static"):
        assert shutil.which(tool), f"{tool} missing: run tools/install-test-deps.sh"
    base = Path(os.environ.get("RASE_AARCH64_ROOT", Path.home() / ".cache" / "rase" / "aarch64"))
    dist = tmp_path_factory.mktemp("aarch64-dist")
    subprocess.run(["bash", "tools/build-wheels.sh", sys.executable], cwd=REPO, check=True, timeout=1800,
                   capture_output=True, env={**os.environ, "RASE_WHEEL_ARCH": "aarch64", "RASE_WHEEL_DIR": str(dist),
                                             "RASE_AARCH64_ROOT": str(base)})
    [wheel] = dist.glob(f"rase-*-{TAG}.whl")
    target = tmp_path_factory.mktemp("aarch64-installed")
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target), "--only-binary",
                    ":all:", "--platform", TAG, "--implementation", "cp", "--python-version", "3.11", "--abi", "cp311",
                    str(wheel)], check=True, timeout=300)
    # the tests that run on the emulated CPU, away from the repo (whose rase/ holds this machine's build)
    tests = target / "run" / "tests"
    shutil.copytree(REPO / "tests", tests, ignore=shutil.ignore_patterns("fixtures", "__pycache__"))
    (tests / "fixtures").symlink_to(REPO / "tests" / "fixtures")
    return base / "root", wheel, target


def _emulated(aarch64, cpu, *args, timeout=900):
    root, _, target = aarch64
    env = {**os.environ, "PYTHONPATH": f"{target}:{root.parent / 'site'}", "RASE_PACK_CACHE": "off"}
    env.pop("RASE_SIMD", None)
    out = subprocess.run(["qemu-aarch64-static", "-cpu", cpu, "-L", str(root), str(root / "usr/bin/python3.11"), *args],
                         env=env, cwd=target / "run", capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return out


def test_the_wheel_is_manylinux_and_carries_its_openmp_runtime(aarch64):
    _, wheel, _ = aarch64
    names = zipfile.ZipFile(wheel).namelist()
    assert wheel.name.endswith(f"-cp311-cp311-{TAG}.whl")
    assert any(n.startswith("rase.libs/libgomp") for n in names) and "rase/kernels/_kernels.cpython-311-aarch64-linux-gnu.so" in names


@pytest.mark.parametrize("cpu", CPUS)
def test_the_wheel_imports_reports_its_levels_and_passes_the_smoke_test(aarch64, cpu):
    out = _emulated(aarch64, cpu, "-c", "import json, platform, rase; print(json.dumps([platform.machine(), rase.build_info()]))")
    machine, info = json.loads(out.stdout)
    assert machine == "aarch64" and info["isa_compiled"] == CPUS["max"]
    assert info["isa_supported"] == CPUS[cpu] and info["isa_selected"] == CPUS[cpu][-1]
    probe = _emulated(aarch64, cpu, "-c", "from rase.cli import main; main(['runtime', 'probe'])").stdout
    assert "tensor_smoke_test: passed" in probe and f"isa={CPUS[cpu][-1]}" in probe


def _pytest_summary(out) -> str:
    last = out.stdout.strip().splitlines()[-1]
    assert re.fullmatch(r"\d+ passed in .*", last), last  # nothing skipped, failed or left out
    return last


KERNEL_SUITE = ["tests/kernels/test_kernels.py", "tests/kernels/test_conv.py", "tests/kernels/test_deltanet.py",
                "tests/kernels/test_smoke.py", "tests/kernels/test_quants.py::test_simd_dequantizer_equals_scalar_bit_for_bit",
                "tests/kernels/test_quantize.py"]


@pytest.mark.parametrize("cpu", CPUS)
def test_the_kernel_suite_passes_on_the_emulated_cpu(aarch64, cpu):
    """Every kernel test: each level against the scalar reference, numpy and the other levels.
    One test compares with llama-cpp-python live, which has no aarch64 wheel: it is left out
    by name, and its subject (MXFP4 against llama.cpp's one-token logits) is
    test_every_family_equals_llama_cpps_one_token_fixtures' gpt-oss-tiny-mxfp4 below."""
    live = "tests/kernels/test_kernels.py::test_mxfp4_logits_equal_llama_cpps_one_token_logits"
    out = _emulated(aarch64, cpu, "-m", "pytest", "-q", "-p", "no:cacheprovider", *KERNEL_SUITE, "--deselect", live,
                    timeout=1800)
    last = out.stdout.strip().splitlines()[-1]
    match = re.fullmatch(r"(\d+) passed, 1 deselected in .*", last)
    assert match and int(match[1]) >= 300, last  # the count grows with the levels the CPU has


@pytest.mark.parametrize("cpu", CPUS)
def test_every_family_equals_llama_cpps_one_token_fixtures(aarch64, cpu):
    out = _emulated(aarch64, cpu, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/models/test_archs.py",
                    "tests/models/test_gpt_oss.py", timeout=1800)
    assert int(_pytest_summary(out).split()[0]) >= 100


@pytest.mark.needs_model
def test_smollm2_logits_on_every_level_are_the_x86_logits(aarch64, smollm2_path, tmp_path):
    """The same bits as x86 on every level, and each level's emulated decode speed, printed."""
    x86 = {}
    for isa in ("scalar", "avx2"):
        subprocess.run([sys.executable, "-c", LOGITS, str(smollm2_path), str(tmp_path / f"x86-{isa}.npy"), TOKENS, isa],
                       check=True, env={**os.environ, "RASE_PACK_CACHE": "off"}, timeout=600, capture_output=True)
        x86[isa] = np.load(tmp_path / f"x86-{isa}.npy")
    speed = {}
    for isa, twin in (("scalar", "scalar"), ("neon", "avx2"), ("dotprod", "avx2"), ("i8mm", "avx2")):
        out = _emulated(aarch64, "max", "-c", LOGITS, str(smollm2_path), str(tmp_path / f"arm-{isa}.npy"), TOKENS, isa)
        speed[isa] = float(out.stdout.split()[-1])
        arm = np.load(tmp_path / f"arm-{isa}.npy")
        assert arm.shape == (11, 49152) and np.isfinite(arm).all()
        assert np.array_equal(arm.view(np.uint32), x86[twin].view(np.uint32)), isa
    assert not np.array_equal(x86["scalar"], x86["avx2"])  # two numerics, each level on its own
    print("\nemulated aarch64 decode, SmolLM2 Q4_1: " + ", ".join(
        f"{isa} {speed[isa] / speed['scalar']:.2f}x scalar" for isa in ("neon", "dotprod", "i8mm")))
