"""The docs and the README name files that exist."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# `rase/x.py`, `tests/test_y.py`, `_forward.h`, `models/base.py`: backticked file names
NAMED = re.compile(r"`((?:[\w.-]+/)*[\w.-]+\.(?:py|pyx|h|md|toml))(?:::\w+)?`")


def _exists(name: str) -> bool:
    return any((base / name).exists() for base in (ROOT, ROOT / "rase", ROOT / "docs"))


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_named_file_exists(doc):
    names = NAMED.findall(doc.read_text())
    missing = [n for n in names if not _exists(n) and "<" not in n]
    assert not missing, f"{doc.name} names files that do not exist: {missing}"


def test_the_pattern_finds_names():
    assert NAMED.findall("see `rase/worker.py` and `_forward.h` and `tests/test_step.py::x`") == [
        "rase/worker.py", "_forward.h", "tests/test_step.py"]
