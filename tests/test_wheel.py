"""The release wheel (tools/build-wheels.sh): built from the sdist, repaired by auditwheel to its
manylinux tag with libgomp vendored, then installed into a fresh venv where no compiler can be
found (CC=/bin/false, a PATH of the venv alone, binary packages only) and run: its build info,
the kernel smoke test, and the demo's answer."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.needs_model  # every test here runs a real model (tests/conftest.py)

REPO = Path(__file__).resolve().parents[1]
TAG = "manylinux_2_34_x86_64"


def test_the_wheel_installs_without_a_compiler_and_answers(tmp_path, smollm2_path):
    if os.uname().machine != "x86_64":
        raise AssertionError("the release wheel is built on x86_64 machines")
    dist = tmp_path / "dist"
    subprocess.run(["bash", "tools/build-wheels.sh", sys.executable], cwd=REPO, check=True, timeout=1200,
                   env={**os.environ, "RASE_WHEEL_DIR": str(dist)}, capture_output=True)
    [wheel] = dist.glob(f"rase-*-{TAG}.whl")
    assert list(dist.glob("rase-*.tar.gz"))  # the sdist it was built from
    names = zipfile.ZipFile(wheel).namelist()
    assert any(n.startswith("rase.libs/libgomp") for n in names) and not any("_kernels_emu.cpython" in n for n in names)

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    env = {"PATH": str(venv / "bin"), "CC": "/bin/false", "CXX": "/bin/false", "HOME": os.environ.get("HOME", "/root"),
           "RASE_STORE": str(tmp_path / "store"), "RASE_PACK_CACHE": str(tmp_path / "packed")}
    assert not any(shutil.which(cc, path=env["PATH"]) for cc in ("gcc", "cc", "clang", "c++", "g++"))
    t0 = time.perf_counter()
    subprocess.run([str(venv / "bin" / "pip"), "install", "-q", "--only-binary", ":all:", str(wheel)], env=env,
                   check=True, timeout=600)
    installed = time.perf_counter() - t0
    rase = [str(venv / "bin" / "rase")]
    info = json.loads(subprocess.run(rase + ["build-info"], env=env, check=True, capture_output=True, text=True).stdout)
    assert info["isa_compiled"] == ["scalar", "avx2", "avx512"] and info["version"] == wheel.name.split("-")[1]
    probe = subprocess.run(rase + ["runtime", "probe"], env=env, check=True, capture_output=True, text=True).stdout
    assert "tensor_smoke_test: passed" in probe
    subprocess.run(rase + ["model", "import", str(smollm2_path), "--id", "smollm2-demo"], env=env, check=True,
                   capture_output=True)  # the demo's model, as `rase demo` would fetch it, without the download
    demo = subprocess.run(rase + ["demo", "--prompt", "What is the capital of France? Answer in one sentence.", "--max-tokens", "24"],
                          env=env, check=True, capture_output=True, text=True, timeout=300).stdout
    assert "Paris" in demo and "finish_reason=" in demo, demo
    print(f"\nwheel {wheel.name}: {wheel.stat().st_size / 1e6:.1f} MB, installed with its dependencies in {installed:.1f} s")
