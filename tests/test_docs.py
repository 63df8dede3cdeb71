"""The docs and the README name files that exist, and their code blocks run."""
from __future__ import annotations

import os
import re
import subprocess
import sys
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
    assert NAMED.findall("see `rase/engine/worker.py` and `_forward.h` and `tests/engine/test_step.py::x`") == [
        "rase/engine/worker.py", "_forward.h", "tests/engine/test_step.py"]


# a file name in a comment or docstring (a rase module, a C header, a test; not llama.cpp's .cpp)
CITED = re.compile(r"(?<![\w/.<-])((?:[\w-]+/)*[\w-]+\.(?:py|pyx|pxi|pxd|h))\b")
EXTERNAL = {"ggml-common.h", "ggml.h", "ggml-cpu.h", "immintrin.h", "omp.h", "stdint.h", "string.h", "math.h",
            "stdlib.h", "time.h", "stddef.h", "simde/x86/avx512.h", "simde/x86/fma.h", "simde/x86/f16c.h",
            "setup.py", "conftest.py", "__init__.py", "__main__.py"}
SOURCES = sorted([*(ROOT / "rase").rglob("*.py"), *(ROOT / "rase").rglob("*.h"), *(ROOT / "rase").rglob("*.pyx"),
                  *(ROOT / "rase").rglob("*.pxi"), *(ROOT / "rase").rglob("*.pxd"), *(ROOT / "tests").rglob("*.py"),
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


# ---------------------------------------------------------------- the docs' code blocks run

# ```python / ```sh blocks run; one whose info string says `not-run: why` is left out with its reason
BLOCK = re.compile(r"^```(\w*)([^\n]*)\n(.*?)^```", re.M | re.S)
SERVED = "127.0.0.1:8080"  # the address the docs show; the calls go to the test's own server


def _blocks() -> list:
    out = []
    for doc in DOCS:
        text = doc.read_text()
        for m in BLOCK.finditer(text):
            lang, info, code = m.group(1), m.group(2).strip(), m.group(3)
            if lang in ("python", "sh"):
                line = text.count("\n", 0, m.start()) + 1
                out.append(pytest.param(lang, info, code, id=f"{doc.name}:{line}",
                                        marks=[] if info.startswith("not-run") else [pytest.mark.needs_model]))
    return out


BLOCKS = _blocks()


def test_every_block_left_out_says_why():
    skipped = [(p.id, p.values[1]) for p in BLOCKS if p.values[1]]
    assert all(re.fullmatch(r"not-run: \S.{15,}", info) for _, info in skipped), skipped
    assert sum(1 for p in BLOCKS if not p.values[1]) >= 15  # most blocks run


@pytest.fixture(scope="module")
def docs_env(tmp_path_factory, smollm2_path):
    """What the docs' blocks assume: a store holding SmolLM2 as "smollm2" served on a port of
    this test, the model's file and a Hugging Face checkpoint in the working folder, the
    repo's tests/ beside them (its fixtures), a home of its own."""
    import sysconfig

    from rase.store.registry import ModelRegistry
    from tests.support.hf_checkpoints import write_checkpoint
    from tests.support.servers import rase_serve

    root = tmp_path_factory.mktemp("docs")
    store, work, home = root / "store", root / "work", root / "home"
    work.mkdir()
    home.mkdir()
    ModelRegistry(store).import_local("smollm2", smollm2_path)
    (work / "SmolLM2-135M-Instruct.Q4_1.gguf").symlink_to(smollm2_path)
    (work / "tests").symlink_to(ROOT / "tests")
    write_checkpoint(work / "my-finetune", "llama3")
    env = {**os.environ, "RASE_STORE": str(store), "HOME": str(home),
           "PATH": f"{sysconfig.get_path('scripts')}:{os.environ.get('PATH', '')}"}
    with rase_serve(store, env={"HOME": str(home)}) as base:
        yield work, env, base.removeprefix("http://")


@pytest.mark.parametrize("lang,info,code", [p for p in BLOCKS if not p.values[1]])
def test_every_code_block_runs(docs_env, lang, info, code):
    """Each block as a reader would run it, against the test's store and server."""
    work, env, served = docs_env
    code = code.replace(SERVED, served)
    cmd = [sys.executable, "-c", code] if lang == "python" else ["bash", "-e", "-o", "pipefail", "-c", code]
    out = subprocess.run(cmd, cwd=work, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]


def test_the_readme_is_a_readme_and_the_manual_is_in_docs():
    """What rase is, how to install and try it, one snippet of each surface, the families, the
    tests, and links: at most 200 lines; the rest is in docs/, which it links."""
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 200
    linked = set(re.findall(r"\]\((docs/[\w.-]+\.md)\)", text))
    assert linked >= {f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md")}
