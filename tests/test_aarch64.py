"""rase on aarch64, emulated: the kernels module cross-compiled with Debian's
gcc-aarch64-linux-gnu (setup.py's flags) against an aarch64 CPython (tools/aarch64-sysroot.sh),
then run by qemu-aarch64. Only the scalar kernels exist there yet (no NEON): the module
imports, says so, passes the kernel smoke test, and SmolLM2's logits are exactly the x86
build's scalar path's (the same C, the same libm results)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]


def _setup_flags() -> list[str]:
    """setup.py's FLAGS (the build's own, read from its source; -O2 here: emulated runs are short)."""
    import ast

    tree = ast.parse((REPO / "setup.py").read_text())
    [value] = [n.value for n in tree.body if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", "") == "FLAGS"]
    return ast.literal_eval(value)


FLAGS = _setup_flags()
TOKENS = "1 504 3575 282 4648 314 3593 30 1070 314 216"
LOGITS = """
import sys, numpy as np
from rase import _kernels
_kernels.set_isa("scalar")
from rase.decoder import load_gguf_decoder
dec = load_gguf_decoder(None, sys.argv[1], n_ctx=64, n_threads=2)
np.save(sys.argv[2], dec.prefill([int(t) for t in sys.argv[3].split()], all_logits=True))
"""


@pytest.fixture(scope="module")
def aarch64(tmp_path_factory):
    """(sysroot, site-packages, a package dir holding rase built for aarch64)."""
    for tool in ("aarch64-linux-gnu-gcc", "qemu-aarch64-static"):
        assert shutil.which(tool), f"{tool} missing: run tools/install-test-deps.sh"
    base = Path(os.environ.get("RASE_AARCH64_ROOT", Path.home() / ".cache" / "rase" / "aarch64"))
    subprocess.run(["bash", str(REPO / "tools" / "aarch64-sysroot.sh"), str(base)], check=True, timeout=1200)
    root = base / "root"
    pkg = tmp_path_factory.mktemp("aarch64-pkg")
    shutil.copytree(REPO / "rase", pkg / "rase", ignore=shutil.ignore_patterns("*.so", "*.c", "__pycache__"))
    src = pkg / "rase" / "_kernels.pyx"
    subprocess.run([sys.executable, "-m", "cython", "-3", str(src), "-o", str(src.with_suffix(".c"))], check=True,
                   capture_output=True)
    subprocess.run(["aarch64-linux-gnu-gcc", "-shared", "-fPIC", "-O2", *FLAGS, f"-I{root}/usr/include/python3.11",
                    f"-I{root}/usr/include", f"-I{pkg / 'rase'}", str(src.with_suffix(".c")), "-o",
                    str(pkg / "rase" / "_kernels.cpython-311-aarch64-linux-gnu.so")], check=True, timeout=900)
    return root, base / "site", pkg


def _emulated(aarch64, *args, **kw):
    root, site, pkg = aarch64
    env = {**os.environ, "PYTHONPATH": f"{pkg}:{site}", "RASE_PACK_CACHE": "off"}
    out = subprocess.run(["qemu-aarch64-static", "-L", str(root), str(root / "usr/bin/python3.11"), *args],
                         env=env, cwd=pkg, capture_output=True, text=True, timeout=600, **kw)  # not the repo's rase
    assert out.returncode == 0, out.stderr[-3000:]
    return out


def test_the_aarch64_build_imports_and_passes_the_smoke_test(aarch64):
    out = _emulated(aarch64, "-c", "import json, platform, rase; print(json.dumps([platform.machine(), rase.build_info()]))")
    machine, info = json.loads(out.stdout)
    assert machine == "aarch64" and info["isa_compiled"] == ["scalar"] and info["isa_selected"] == "scalar"
    probe = _emulated(aarch64, "-c", "from rase.cli import main; main(['runtime', 'probe'])").stdout
    assert "tensor_smoke_test: passed" in probe and "isa=scalar" in probe


def test_smollm2_logits_on_aarch64_are_the_x86_scalar_paths(aarch64, smollm2_path, tmp_path):
    _emulated(aarch64, "-c", LOGITS, str(smollm2_path), str(tmp_path / "arm.npy"), TOKENS)
    subprocess.run([sys.executable, "-c", LOGITS, str(smollm2_path), str(tmp_path / "x86.npy"), TOKENS], check=True,
                   env={**os.environ, "RASE_PACK_CACHE": "off"}, timeout=600)
    arm, x86 = np.load(tmp_path / "arm.npy"), np.load(tmp_path / "x86.npy")
    assert arm.shape == (11, 49152) and np.isfinite(arm).all()
    assert np.array_equal(arm.view(np.uint32), x86.view(np.uint32))
