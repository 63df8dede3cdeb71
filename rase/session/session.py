"""Resident sessions: a registered model verified and loaded once, then reused.

SessionCache keys sessions by (model id, device). A session is reloaded when its manifest
changes (weights or tokenizer hash, template, architecture, paths) and re-verified when a file
it uses changed on disk (size, mtime or inode): a mismatch raises IntegrityMismatch and drops
the session. Concurrent first loads of one key load once. A session owns its model's worker
(worker.py: one thread, continuous batching over the KV pool); a dropped session's worker
finishes the requests it already has, then stops. Different models run in parallel.
"""
from __future__ import annotations

import functools
import os
import threading
from dataclasses import dataclass, field
from typing import Callable

from ..engine.config import DEVICES, EngineConfig
from ..engine.worker import ModelWorker
from ..errors import BackendUnavailable, IntegrityMismatch, InvalidRequest, UnsupportedFormat
from ..models import resolve
from ..store.plan import ModelPlan, check_draft, load_plan
from ..store.registry import ModelManifest, ModelRegistry



def _fingerprint(manifest: ModelManifest) -> tuple:
    out = []
    for path in (manifest.weights, manifest.tokenizer, manifest.mmproj):
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
            m.context_length, m.chat_template, m.format, m.mmproj, m.mmproj_sha256)


@dataclass(eq=False)
class Session:
    manifest: ModelManifest
    plan: ModelPlan
    tokenizer: object = None  # LocalTokenizer: the attached tokenizer.json, else the GGUF's vocabulary
    worker: ModelWorker | None = None
    n_threads: int | None = None
    _grammar_vocab: object = None
    _render: object = None
    _harmony: object = False  # harmony_ids() once found (False: not looked up yet)
    _think: object = False    # reasoning_tags() once found
    _init_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def images(self):
        """The model's vision encoder (engine.media.ImageEncoder), or None without an mmproj."""
        return self.worker.images if self.worker is not None else None

    def grammar_vocab(self):
        """The vocabulary for constrained decoding (structured.GrammarVocab), built on first use."""
        from ..text.structured import GrammarVocab

        with self._init_lock:
            if self._grammar_vocab is None:
                self._grammar_vocab = GrammarVocab(self.tokenizer, self.plan.vocab_size, [self.plan.eos_token])
            return self._grammar_vocab

    def _renderer(self):
        """The chat template, parsed once per session (a session's manifest never changes)."""
        from ..text.chat import select_template

        with self._init_lock:
            if self._render is None:
                self._render = select_template(self.manifest.chat_template, self.plan.gguf, self.plan.architecture)
            return self._render

    def _template(self):
        """The model's own Jinja template (chat.JinjaTemplate), or None for a built-in one."""
        from ..text.chat import JinjaTemplate

        jt = getattr(self._renderer(), "__self__", None)
        return jt if isinstance(jt, JinjaTemplate) else None

    def harmony_ids(self) -> dict[str, int] | None:
        """gpt-oss's harmony control tokens -> ids when the model's template writes harmony
        (<|channel|>) and each is one token of its vocabulary; else None (harmony.py)."""
        from ..text.harmony import control_ids

        if self._harmony is False:  # looked up once per session, not per request
            jt = self._template()
            self._harmony = control_ids(self.tokenizer) if jt is not None and "<|channel|>" in jt.source else None
        return self._harmony

    def reasoning_tags(self) -> tuple[int, int] | None:
        """(<think>, </think>) ids when each is one token of the vocabulary (Qwen3, SmolLM3,
        DeepSeek-R1 distills): the model may reason in such a block; else None (thinking.py)."""
        if self._think is False:
            ids = [self.tokenizer.encode(t, add_special_tokens=False, parse_special=True) for t in ("<think>", "</think>")]
            self._think = (ids[0][0], ids[1][0]) if all(len(i) == 1 for i in ids) else None
        return self._think

    def tool_format(self) -> str:
        """"harmony" for gpt-oss (tools in the template, calls in the commentary channel);
        "hermes" when the model's own template lays out tools and <tool_call> is one of its
        tokens (Qwen2.5/3, Hermes); else "generic" (tools.py)."""
        jt = self._template()
        if jt is not None and jt.renders_tools and self.harmony_ids() is not None:
            return "harmony"
        if jt is not None and jt.renders_tools and "<tool_call>" in jt.source:
            ids = self.tokenizer.encode("<tool_call>", add_special_tokens=False, parse_special=True)
            if len(ids) == 1:
                return "hermes"
        return "generic"

    def render_chat(self, messages, tools=None, reasoning_effort: str | None = None,
                    template_kwargs: dict | None = None) -> list[int]:
        """Chat messages -> prompt ids (the template writes the special tokens itself)."""
        text = self.chat_prompt(messages, tools, reasoning_effort, template_kwargs)
        return self.tokenizer.encode(text, add_special_tokens=False, parse_special=True)

    def chat_prompt(self, messages, tools=None, reasoning_effort: str | None = None,
                    template_kwargs: dict | None = None) -> str:
        """The prompt text of chat messages. tools: a tools.ToolSpec to offer: the template
        renders them (hermes, harmony), or a system message carries them and tool turns become
        text (generic). reasoning_effort: low / medium / high, for a template that reads it.
        template_kwargs: more variables for the model's Jinja template (llama-server's
        chat_template_kwargs, e.g. Qwen3's enable_thinking), checked by the engine."""
        render = self._renderer()
        if template_kwargs:
            if self._template() is None:
                raise InvalidRequest("chat_template_kwargs: this model's chat template is built in, not a Jinja "
                                     "template that reads variables", "chat_template_kwargs")
            render = functools.partial(render, **template_kwargs)
        if reasoning_effort is not None:
            render = functools.partial(render, **self._effort(reasoning_effort, template_kwargs or {}))
        generic = self.tool_format() == "generic"
        if tools is None and generic and any(m.get("tool_calls") or m.get("role") == "tool" for m in messages):
            from ..text.chat import generic_tool_messages

            text = render(generic_tool_messages(messages))  # earlier tool turns, though no tools are offered now
        elif tools is None:
            text = render(messages)
        elif self.tool_format() in ("hermes", "harmony"):
            text = render(messages, tools=tools.offered)
        else:
            from ..text.chat import generic_tool_messages
            from ..text.tools import generic_system_message

            msgs, system = generic_tool_messages(messages), generic_system_message(tools)
            if msgs[0]["role"] == "system":
                msgs[0] = {"role": "system", "content": msgs[0]["content"] + "\n\n" + system["content"]}
            else:
                msgs.insert(0, system)
            text = render(msgs)
        return text

    def reasoning_switch(self) -> str | None:
        """The template variable that sets how much the model reasons: "reasoning_effort"
        (gpt-oss), "enable_thinking" (Qwen3's on/off), or None."""
        jt = self._template()
        return next((v for v in ("reasoning_effort", "enable_thinking") if jt is not None and v in jt.source), None)

    def _effort(self, effort: str, template_kwargs: dict) -> dict:
        """reasoning_effort as the template reads it: itself (gpt-oss reasons at low, medium or
        high: none and minimal are its low), or Qwen3's on/off switch enable_thinking (none and
        minimal: off) unless that is set; a template with neither renders as it would without
        (as llama-server passes it: a model that does not reason spends no effort on it)."""
        switch = self.reasoning_switch()
        if switch == "reasoning_effort":
            return {"reasoning_effort": "low" if effort in ("none", "minimal") else effort}
        if switch == "enable_thinking" and "enable_thinking" not in template_kwargs:
            return {"enable_thinking": effort not in ("none", "minimal")}
        return {}

    def close(self) -> None:
        if self.worker is not None:
            self.worker.close()


@dataclass
class _Entry:
    session: Session
    state: tuple
    fingerprint: tuple


def _draft_plan(plan: ModelPlan, manifest: ModelManifest, draft: Callable[[], ModelManifest]) -> ModelPlan:
    """The plan of the draft model draft() names (verified), checked against plan; the model
    drafting for itself shares its plan."""
    dm = draft()
    if dm.id == manifest.id:
        return plan
    if dm.format != "gguf":
        raise UnsupportedFormat(f"draft model {dm.id!r}: only GGUF model bundles are executable")
    return check_draft(plan, load_plan(dm.weights, dm.architecture), f"draft model {dm.id!r}")


def _image_encoder(manifest: ModelManifest, plan: ModelPlan):
    """The manifest's mmproj loaded (its tensors read once), paired with the text model."""
    from ..engine.media import ImageEncoder
    from ..models.vision import load_encoder
    from ..store.gguf import GGUFFile
    from ..store.registry import check_mmproj_pair

    check_mmproj_pair(manifest.weights, manifest.mmproj, manifest.id)
    with GGUFFile(manifest.mmproj) as g:
        module, encoder = load_encoder(g)
    return ImageEncoder(module, encoder)


def load_session(manifest: ModelManifest, config: EngineConfig = EngineConfig(),
                 draft: Callable[[], ModelManifest] | None = None) -> Session:
    """Verified manifest -> plan (config.n_ctx), tokenizer and worker (the rest of config).
    draft: the verified manifest of the model that drafts for a generator (speculative), loaded
    beside it."""
    if manifest.format != "gguf":
        raise UnsupportedFormat("only GGUF model bundles are currently executable")
    from ..text.tokenizer import LocalTokenizer

    if manifest.architecture is not None:
        resolve(manifest.architecture)  # refuse before touching the file
    plan = load_plan(manifest.weights, manifest.architecture, config.n_ctx)
    tokenizer = (LocalTokenizer.from_file(manifest.tokenizer) if manifest.tokenizer
                 else LocalTokenizer.from_gguf(plan.gguf))
    draft_plan = _draft_plan(plan, manifest, draft) if draft is not None and plan.weights.causal else None
    images = _image_encoder(manifest, plan) if manifest.mmproj else None
    worker = ModelWorker(plan, config, name=manifest.id, draft=draft_plan, images=images)
    return Session(manifest, plan, tokenizer, worker, config.n_threads)


class SessionCache:
    def __init__(self, loader: Callable[[ModelManifest], Session] = load_session) -> None:
        self._loader = loader
        self._lock = threading.Lock()  # guards the two dicts, never held while loading
        self._entries: dict[tuple[str, str], _Entry] = {}
        self._key_locks: dict[tuple[str, str], threading.Lock] = {}
        self.loads = 0  # how many sessions were loaded (observable reuse)
        self._loading: set[str] = set()  # model ids being loaded now
        self.on_drop: Callable[[Session], None] | None = None  # called for every session dropped

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
            with self._lock:
                self._loading.add(model_id)
            try:
                session = self._loader(manifest)
            finally:
                with self._lock:
                    self._loading.discard(model_id)
            self.loads += 1
            with self._lock:
                self._entries[key] = _Entry(session, _manifest_state(manifest), _fingerprint(manifest))
            return session

    def _drop(self, key: tuple[str, str]) -> None:
        with self._lock:
            entry = self._entries.pop(key, None)
        if entry is not None:
            self._retire(entry.session)

    def _retire(self, session: Session) -> None:
        if self.on_drop is not None:
            self.on_drop(session)
        if hasattr(session, "close"):
            session.close()

    def loaded(self) -> list[tuple[str, str]]:
        with self._lock:
            return sorted(self._entries)

    def sessions(self) -> list[tuple[tuple[str, str], Session]]:
        with self._lock:
            return [(k, e.session) for k, e in sorted(self._entries.items())]

    def status(self, model_id: str) -> str:
        """"loaded", "loading" or "unloaded"."""
        with self._lock:
            if any(k[0] == model_id for k in self._entries):
                return "loaded"
            return "loading" if model_id in self._loading else "unloaded"

    def unload(self, model_id: str) -> bool:
        """Unload model_id's sessions (requests already queued on one still finish); whether any was loaded."""
        with self._lock:
            keys = [k for k in self._entries if k[0] == model_id]
        for key in keys:
            with self._key_lock(key):
                self._drop(key)
        return bool(keys)

    def clear(self) -> None:
        """Unload every session (requests already queued on one still finish)."""
        with self._lock:
            entries, self._entries = list(self._entries.values()), {}
        for entry in entries:
            self._retire(entry.session)
