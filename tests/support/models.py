"""The test models: the two real GGUFs fetched from PyPI (cached outside the repo), and the
fixture files the tests carry."""
from __future__ import annotations

import os
from pathlib import Path

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
ARCHS = FIXTURES / "archs"  # tiny files of llama.cpp's exact layout, one per family (tools/make_arch_fixtures.py)
NAMES = sorted(p.stem for p in ARCHS.glob("*.gguf") if (ARCHS / f"{p.stem}.llamacpp-t1.json").exists())
ENCODERS = sorted(p.stem for p in ARCHS.glob("*.gguf") if (ARCHS / f"{p.stem}.llamacpp-embd.json").exists())
QWEN3_TINY = FIXTURES / "qwen3-tiny"


def models_dir() -> Path:
    return Path(os.environ.get("RASE_TEST_MODELS") or Path.home() / ".cache" / "rase" / "test-models")
