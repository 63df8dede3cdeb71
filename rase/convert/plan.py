"""The GGUF's tensors, in file order, each from its Hugging Face sources: token_embd, rope_freqs,
every layer's tensors in the architecture's order (experts stacked into one 3-D tensor), then
output_norm and output. Every checkpoint tensor must land somewhere: one that no rule places is
refused, not dropped."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..errors import UnsupportedArchitecture
from .archs import GLOBAL, SKIP, HFArch, llama3_rope_freqs
from .checkpoint import Checkpoint, SourceTensor


@dataclass
class OutTensor:
    name: str
    shape: tuple[int, ...]                 # numpy order: (experts,) rows, columns
    sources: list[SourceTensor] = field(default_factory=list)  # stacked along the first axis
    fix: str = ""                          # "q" / "k": llama's RoPE row permutation; "plus1": Gemma norms
    data: np.ndarray | None = None         # made here (rope_freqs), float32
    qtype: int = 0                         # ggml type in the file (set by the mix)

    @property
    def ncols(self) -> int:
        return self.shape[-1]


def _one(ckpt: Checkpoint, name: str, out: str, used: set, arch: HFArch) -> OutTensor | None:
    t = ckpt.tensors.get(name)
    if t is None:
        return None
    used.add(name)
    fix = ""
    if arch.permute and ".self_attn.q_proj." in name:
        fix = "q"
    elif arch.permute and ".self_attn.k_proj." in name:
        fix = "k"
    elif arch.norm_plus1 and name.endswith("norm.weight"):
        fix = "plus1"
    return OutTensor(out, t.shape, [t], fix)


def _experts(ckpt: Checkpoint, arch: HFArch, i: int, n_expert: int, used: set) -> list[OutTensor]:
    prefix, out = f"model.layers.{i}.", []
    router = ckpt.tensors.get(prefix + arch.experts.router)
    if router is None:
        raise UnsupportedArchitecture(arch.gguf, (), f"layer {i} has no router {prefix + arch.experts.router}")
    used.add(router.name)
    out.append(OutTensor(f"blk.{i}.ffn_gate_inp.weight", router.shape, [router]))
    for hf, gguf in arch.experts.mats.items():
        names = [prefix + hf.format(e=e) for e in range(n_expert)]
        missing = [n for n in names if n not in ckpt.tensors]
        if missing:
            raise UnsupportedArchitecture(arch.gguf, (), f"expert tensors missing: {', '.join(missing[:3])}")
        sources = [ckpt.tensors[n] for n in names]
        if len({s.shape for s in sources}) != 1:
            raise UnsupportedArchitecture(arch.gguf, (), f"experts of {prefix + hf} differ in shape")
        used.update(names)
        out.append(OutTensor(f"blk.{i}.{gguf}", (n_expert, *sources[0].shape), sources))
    return out


def build(ckpt: Checkpoint, arch: HFArch) -> list[OutTensor]:
    cfg, used, out = ckpt.config, set(), []
    n_expert = int(cfg.get("num_local_experts", cfg.get("num_experts", 0)) or 0) if arch.experts else 0
    embd = _one(ckpt, "model.embed_tokens.weight", GLOBAL["model.embed_tokens.weight"], used, arch)
    if embd is None:
        raise UnsupportedArchitecture(arch.gguf, (), "the checkpoint has no model.embed_tokens.weight")
    out.append(embd)
    freqs = llama3_rope_freqs(cfg)
    if freqs is not None:
        out.append(OutTensor("rope_freqs.weight", freqs.shape, data=freqs))
    for i in range(cfg["num_hidden_layers"]):
        for hf, gguf in arch.layer.items():
            t = _one(ckpt, f"model.layers.{i}.{hf}", f"blk.{i}.{gguf}", used, arch)
            if t is None and hf.endswith(".weight") and "bias" not in hf:
                raise UnsupportedArchitecture(arch.gguf, (), f"the checkpoint lacks model.layers.{i}.{hf}")
            if t is not None:
                out.append(t)
        if arch.experts:
            out += _experts(ckpt, arch, i, n_expert, used)
    for hf in ("model.norm.weight", "lm_head.weight"):
        t = _one(ckpt, hf, GLOBAL[hf], used, arch)
        if t is None and hf == "model.norm.weight":
            raise UnsupportedArchitecture(arch.gguf, (), "the checkpoint has no model.norm.weight")
        if t is not None:
            out.append(t)
    left = sorted(n for n in ckpt.tensors if n not in used and not n.endswith(SKIP))
    if left:
        raise UnsupportedArchitecture(
            arch.gguf, (), f"{len(left)} checkpoint tensors have no place in a {arch.gguf} GGUF "
            f"({', '.join(left[:4])}{', ...' if len(left) > 4 else ''}); rase refuses rather than drop them")
    return _in_file_order(ckpt, out)


def _in_file_order(ckpt: Checkpoint, tensors: list[OutTensor]) -> list[OutTensor]:
    """Made tensors first, then by where their (first) source lies: shards are read front to back,
    which is also what lets the reads hash them (Checkpoint.read). A GGUF's tensor order is free;
    the type mix does not follow it (mix.quantize_order)."""
    shard = {p: i for i, p in enumerate(dict.fromkeys(t.path for t in ckpt.tensors.values()))}
    return sorted(tensors, key=lambda t: (-1, 0) if t.data is not None else
                  (shard[t.sources[0].path], t.sources[0].offset))


def permutation(rows: int, n_head: int) -> np.ndarray:
    """Source row of each output row: HF keeps each head's RoPE halves apart, llama.cpp's llama
    interleaves them (convert_hf_to_gguf's LlamaModel.permute)."""
    return np.arange(rows).reshape(n_head, 2, rows // n_head // 2).swapaxes(1, 2).reshape(rows)
