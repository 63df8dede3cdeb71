"""GGUF file -> the C plan of one model, built once at load and shared by everything that runs
it (the single-stream decoder, the model's worker thread). Weights stay in the mmap, except the
repacked types' 16-row copies: mapped from pack_cache when an earlier load wrote them, else made
here (and written for the next load)."""
from __future__ import annotations

import bisect
import os
from dataclasses import dataclass

from ..kernels import _kernels
from ..config import default_threads
from ..errors import CorruptModelFile, InvalidRequest, UnsupportedArchitecture
from .gguf import GGUFFile
from ..models import ARCHITECTURES, resolve
from ..models.base import HParams, read_hparams
from ..models.layout import build_layout
from .pack_cache import PackCache

KV_BLOCK = _kernels.KV_BLOCK
KV_TYPES = tuple(_kernels.KV_TYPES)  # the KV pool's element types: f16, q8_0, q4_0 (llama.cpp's -ctk names)


@dataclass(frozen=True)
class ModelPlan:
    gguf: GGUFFile
    architecture: str        # canonical name (models.ARCHITECTURES key)
    hparams: HParams
    n_ctx: int               # positions one sequence may reach
    weights: _kernels.Weights
    eos_token: int | None    # the manual: only a u32 tokenizer.ggml.eos_token_id counts
    output_norm: object = None  # float32 (n_embd,): the final norm's weights (embeddings pool after it)

    @property
    def vocab_size(self) -> int:
        return self.hparams.n_vocab

    @property
    def kv_bytes_per_token(self) -> int:
        return self.weights.kv_bytes_per_token

    def kv_bytes(self, kv_type: str) -> int:
        """K and V bytes of one position in a pool of kv_type (check_kv_type)."""
        return self.weights.kv_bytes(kv_type)


class _TensorAt:
    """The tensor whose data holds a view (a whole tensor, a fused part, one expert's slice),
    and the view's byte offset in it; (None, 0) for a buffer outside the file."""

    def __init__(self, g: GGUFFile) -> None:
        self._spans = sorted((t.data.ctypes.data, t.data.nbytes, t) for t in g.tensors.values() if t.data.nbytes)
        self._starts = [s[0] for s in self._spans]

    def __call__(self, data) -> tuple:
        addr = data.ctypes.data
        i = bisect.bisect_right(self._starts, addr) - 1
        if i >= 0 and addr + data.nbytes <= self._spans[i][0] + self._spans[i][1]:
            return self._spans[i][2], addr - self._spans[i][0]
        return None, 0


def load_plan(path: str | os.PathLike[str], architecture: str | None = None,
              n_ctx: int | None = None, *, for_pack: bool = False) -> ModelPlan:
    """for_pack: a plan made only to write the pack cache (prepare): returns once it is
    written, and maps none of the tensors a forward streams."""
    g = GGUFFile(path)
    file_arch = g.architecture
    if file_arch is None:
        raise CorruptModelFile(g.path, "metadata general.architecture is missing")
    arch = resolve(file_arch)
    if architecture is not None and resolve(architecture) != arch:
        raise UnsupportedArchitecture(
            architecture, reason=f"the file declares {file_arch!r}; register the model "
            f"with architecture {file_arch!r} or leave it unset")
    hp = read_hparams(g)
    ctx = hp.context_length if n_ctx is None else int(n_ctx)  # the KV budget, not n_ctx, bounds memory (worker.pool_blocks)
    if ctx < 1:
        raise InvalidRequest(f"n_ctx must be positive, got {n_ctx}")
    spec = ARCHITECTURES[arch].spec(g, hp)
    forward = build_layout(g, hp, spec, ctx)
    holder = _TensorAt(g)

    def packed(data, start: int, end: int, copied: bool) -> None:
        """Map a chunk in one go before it is copied; give it back after (the private copy is
        what the forward reads). data may be one expert's slice of a 3-D tensor."""
        t, off = holder(data)
        if t is not None:
            (g.release if copied else g.populate)(t, off + start, off + end)

    cache = PackCache(g.path)
    try:
        weights = _kernels.Weights(forward, default_threads(), packed, packed=cache.load(huge_pages=not hp.n_expert))
    except ValueError as exc:
        raise CorruptModelFile(g.path, str(exc)) from None
    saving = cache.save_in_background(weights.repacked)  # later loads map it instead of repacking
    if for_pack and saving is not None:
        saving.join()
    for data in () if for_pack else weights.streamed:  # mapped now, in one call each, as llama.cpp's MAP_POPULATE does
        t, off = holder(data)
        if t is not None:
            g.populate(t, off, off + data.nbytes)
    eos = g.get("tokenizer.ggml.eos_token_id")
    eos = eos if g.metadata_types.get("tokenizer.ggml.eos_token_id") == 4 else None
    return ModelPlan(g, arch, hp, ctx, weights, eos, forward.output_norm)


def prepare(path: str | os.PathLike[str]) -> int:
    """Write the pack cache of the GGUF at path now, as registration does, so that its first
    load maps the repacked matrices instead of making them (a 1.7B Q4_K_M: 0.03 s instead of
    0.3-1.1 s). The bytes repacked: 0 when the cache holds them already or is off, or no matrix
    of the file is of a repacked type."""
    cache = PackCache(path)
    if not cache.enabled or cache.load(populate=False) is not None:
        return 0
    plan = load_plan(path, for_pack=True)
    n = sum(int(a.nbytes) for a in plan.weights.repacked.values())
    plan.gguf.close()
    return n


DRAFT_VOCAB_SLACK = 128  # llama.cpp's SPEC_VOCAB_MAX_SIZE_DIFFERENCE: padded vocabularies of one family


def check_draft(plan: ModelPlan, draft: ModelPlan, name: str = "the draft model") -> ModelPlan:
    """draft if it can draft for plan (speculative decoding), else InvalidRequest saying why: a
    causal model with no recurrent state (its cache must step back to the tokens kept) and
    llama.cpp's compatible vocabulary (common_speculative_are_compatible): the same tokenizer
    model, BOS and EOS, sizes within DRAFT_VOCAB_SLACK, and the same text for every token id
    from 5 on that both have. Drafts past the smaller vocabulary are never verified."""
    if not draft.weights.causal or draft.weights.state_bytes:
        raise InvalidRequest(f"{name} ({draft.architecture}) cannot draft: a draft model must be a plain "
                             "causal model, without recurrent layers", "speculative")
    g, d = plan.gguf, draft.gguf
    ours, theirs = g.get("tokenizer.ggml.tokens") or [], d.get("tokenizer.ggml.tokens") or []
    n = min(len(ours), len(theirs))
    differ = [key for key in ("tokenizer.ggml.model", "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id")
              if g.get(key) != d.get(key)]
    if differ or not n or abs(len(ours) - len(theirs)) > DRAFT_VOCAB_SLACK or ours[5:n] != theirs[5:n]:
        why = f"its {differ[0]} differs" if differ else f"{len(theirs)} tokens against {len(ours)}, not the same ones"
        raise InvalidRequest(f"{name}'s vocabulary is not the model's ({why}): draft with a model of the same "
                             "family and tokenizer", "speculative")
    return draft


def check_kv_type(plan: ModelPlan, kv_type: str) -> str:
    """kv_type if a pool of it can hold this model's K/V (f16; q8_0 and q4_0, llama.cpp's -ctk /
    -ctv blocks, for head sizes divisible by 32), else InvalidRequest."""
    try:
        plan.weights.kv_bytes(kv_type)
    except (ValueError, TypeError) as exc:
        raise InvalidRequest(f"kv_type: {exc}", "kv_type") from None
    return kv_type


def blocks_for(positions: int) -> int:
    return -(-positions // KV_BLOCK)
