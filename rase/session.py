"""Resident sessions: a registered model verified and loaded once, then reused.

SessionCache keys sessions by (model id, device). A session is reloaded when its manifest
changes (weights or tokenizer hash, template, architecture, paths) and re-verified when a file
it uses changed on disk (size, mtime or inode): a mismatch raises IntegrityMismatch and drops
the session. Concurrent first loads of one key load once; each session carries its own lock,
so generations on one model serialize while different models run in parallel.
"""
from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field
from typing import Callable

from .decoder import GGUFDecoder, load_gguf_decoder
from .errors import BackendUnavailable, IntegrityMismatch, UnsupportedFormat
from .registry import ModelManifest, ModelRegistry

DEVICES = ("auto", "cpu")  # rase runs on the CPU; "auto" resolves to it


def _fingerprint(manifest: ModelManifest) -> tuple:
    out = []
    for path in (manifest.weights, manifest.tokenizer):
        if path is None:
            out.append(None)
            continue
        try:
            st = os.stat(path)
        except OSError:
            out.append("missing")
            continue
        out.append((st.st_size, st.st_mtime_ns, st.st_ino))
    return tuple(out)


def _manifest_state(m: ModelManifest) -> tuple:
    return (m.weights, m.sha256, m.tokenizer, m.tokenizer_sha256, m.architecture,
            m.context_length, m.chat_template, m.format)


@dataclass
class Session:
    manifest: ModelManifest
    decoder: GGUFDecoder
    tokenizer: object = None  # LocalTokenizer: the attached tokenizer.json, else the GGUF's vocabulary
    lock: threading.Lock = field(default_factory=threading.Lock)  # one generation at a time

    def render_chat(self, messages) -> list[int]:
        """Chat messages -> prompt ids (the template writes the special tokens itself)."""
        from .chat import select_template

        render = select_template(self.manifest.chat_template, self.decoder.gguf, self.decoder.architecture)
        return self.tokenizer.encode(render(messages), add_special_tokens=False, parse_special=True)


@dataclass
class _Entry:
    session: Session
    state: tuple
    fingerprint: tuple


def load_session(manifest: ModelManifest, n_threads: int | None = None, n_ctx: int | None = None) -> Session:
    if manifest.format != "gguf":
        raise UnsupportedFormat("only GGUF model bundles are currently executable")
    from .tokenizer import LocalTokenizer

    decoder = load_gguf_decoder(manifest.architecture, manifest.weights, n_threads=n_threads, n_ctx=n_ctx)
    tokenizer = (LocalTokenizer.from_file(manifest.tokenizer) if manifest.tokenizer
                 else LocalTokenizer.from_gguf(decoder.gguf))
    return Session(manifest, decoder, tokenizer)


class SessionCache:
    def __init__(self, loader: Callable[[ModelManifest], Session] = load_session) -> None:
        self._loader = loader
        self._lock = threading.Lock()  # guards the two dicts, never held while loading
        self._entries: dict[tuple[str, str], _Entry] = {}
        self._key_locks: dict[tuple[str, str], threading.Lock] = {}
        self.loads = 0  # how many sessions were loaded (observable reuse)

    def _key_lock(self, key: tuple[str, str]) -> threading.Lock:
        with self._lock:
            return self._key_locks.setdefault(key, threading.Lock())

    def get_or_load(self, registry: ModelRegistry, model_id: str, device: str = "auto") -> Session:
        if device not in DEVICES:
            raise BackendUnavailable(
                f"requested backend is unavailable: {device!r}; rase runs on the CPU (use 'cpu' or 'auto')")
        key = (model_id, device)
        with self._key_lock(key):
            manifest = registry.get(model_id)
            with self._lock:
                entry = self._entries.get(key)
            if entry is not None and entry.state == _manifest_state(manifest) \
                    and entry.fingerprint == _fingerprint(manifest):
                return entry.session
            self._drop(key)
            try:
                manifest = registry.verify(model_id)  # full re-hash before (re)loading
            except IntegrityMismatch:
                self._drop(key)
                raise
            session = self._loader(manifest)
            self.loads += 1
            with self._lock:
                self._entries[key] = _Entry(session, _manifest_state(manifest), _fingerprint(manifest))
            return session

    def _drop(self, key: tuple[str, str]) -> None:
        with self._lock:
            self._entries.pop(key, None)

    def loaded(self) -> list[tuple[str, str]]:
        with self._lock:
            return sorted(self._entries)

    def clear(self) -> None:
        """Unload every session (callers still holding one keep it until they finish)."""
        with self._lock:
            self._entries.clear()
