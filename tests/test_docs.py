"""The docs and the README name files that exist."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# `rase/<module>.py`, `tests/<test>.py`, `_forward.h`, `models/base.py`: backticked file names
WINGS = sorted(p for p in (ROOT / "rase").iterdir() if (p / "__init__.py").exists())  # rase/engine/, ...
NAMED = re.compile(r"`((?:[\w.-]+/)*[\w.-]+\.(?:py|pyx|h|md|toml))(?:::\w+)?`")


def _exists(name: str) -> bool:
    return any((base / name).exists() for base in (ROOT, ROOT / "rase", ROOT / "docs", *WINGS))


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_named_file_exists(doc):
    names = NAMED.findall(doc.read_text())
    missing = [n for n in names if not _exists(n) and "<" not in n]
    assert not missing, f"{doc.name} names files that do not exist: {missing}"


def test_the_pattern_finds_names():
    assert NAMED.findall("see `rase/engine/worker.py` and `_forward.h` and `tests/test_step.py::x`") == [
        "rase/engine/worker.py", "_forward.h", "tests/test_step.py"]


# a file name in a comment or docstring (a rase module, a C header, a test; not llama.cpp's .cpp)
CITED = re.compile(r"(?<![\w/.<-])((?:[\w-]+/)*[\w-]+\.(?:py|pyx|pxi|pxd|h))\b")
EXTERNAL = {"ggml-common.h", "ggml.h", "ggml-cpu.h", "immintrin.h", "omp.h", "stdint.h", "string.h", "math.h",
            "stdlib.h", "time.h", "stddef.h", "simde/x86/avx512.h", "simde/x86/fma.h", "simde/x86/f16c.h",
            "setup.py", "conftest.py", "__init__.py", "__main__.py"}
SOURCES = sorted([*(ROOT / "rase").rglob("*.py"), *(ROOT / "rase").rglob("*.h"), *(ROOT / "rase").rglob("*.pyx"),
                  *(ROOT / "rase").rglob("*.pxi"), *(ROOT / "rase").rglob("*.pxd"), *(ROOT / "tests").glob("*.py"),
                  *(ROOT / "benchmarks").glob("*.py"), *(ROOT / "tools").glob("*.py")])


def _comments(path: Path) -> str:
    """The comments and docstrings of a source file (C: // and /* */; Python: # and strings that
    stand alone as statements)."""
    text = path.read_text()
    if path.suffix in (".h",):
        return "\n".join(re.findall(r"//[^\n]*|/\*.*?\*/", text, re.S))
    import ast
    import io
    import tokenize

    out = [tok.string for tok in tokenize.generate_tokens(io.StringIO(text).readline) if tok.type == tokenize.COMMENT]
    if path.suffix == ".py":
        out += [n.value.value for n in ast.walk(ast.parse(text))
                if isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant) and isinstance(n.value.value, str)]
    return "\n".join(out)


def _cited_exists(name: str) -> bool:
    bases = (ROOT, ROOT / "rase", ROOT / "docs", ROOT / "tests", *WINGS)
    if name in EXTERNAL or name.split("/")[-1] in EXTERNAL or name.startswith("ray/"):  # Ray's own sources
        return True
    return any((b / name).exists() for b in bases)


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_file_cited_in_a_comment_exists(path):
    """A comment that points at a file points at one that exists (files move: comments follow)."""
    missing = sorted({n for n in CITED.findall(_comments(path)) if not _cited_exists(n)})
    assert not missing, f"{path.relative_to(ROOT)} cites files that do not exist: {missing}"
