"""Architectures, keyed by GGUF `general.architecture` (and the manual's aliases)."""
from __future__ import annotations

from types import ModuleType

from ..errors import UnsupportedArchitecture
from . import (bert, gemma, gemma2, gemma3, gpt_oss, granite, lfm2, llama, nomic_bert, olmo2, olmoe, phi3, qwen2,
               qwen2vl, qwen3, qwen3moe, qwen35, smollm3)

ARCHITECTURES: dict[str, ModuleType] = {
    "llama": llama, "qwen2": qwen2, "qwen3": qwen3, "qwen3moe": qwen3moe, "phi3": phi3,
    "gemma": gemma, "gemma2": gemma2, "gemma3": gemma3, "olmo2": olmo2, "olmoe": olmoe,
    "smollm3": smollm3, "granite": granite, "bert": bert, "nomic-bert": nomic_bert, "gpt-oss": gpt_oss,
    "lfm2": lfm2, "qwen35": qwen35, "qwen2vl": qwen2vl,
}

ALIASES: dict[str, str] = {
    **{name: name for name in ARCHITECTURES},
    "llama2": "llama", "llama3": "llama", "llama-gguf": "llama", "mistral": "llama", "mixtral": "llama",
    "qwen2.5": "qwen2", "qwen2-gguf": "qwen2", "qwen3-gguf": "qwen3", "phi4": "phi3",
}

REFUSED: dict[str, str] = {
    "qwen": "Qwen 1 is not supported; use a Qwen2.5 or Qwen3 GGUF (architecture 'qwen2' or 'qwen3')",
    "qwen2moe": "Qwen2-MoE's shared experts are not implemented yet; use a Qwen3-MoE GGUF "
                "(architecture 'qwen3moe') or a dense Qwen2.5",
    "qwen35moe": "Qwen3.5-MoE (its routed experts beside a shared expert) is not implemented yet; use a dense "
                 "Qwen3.5 GGUF (architecture 'qwen35')",
    "lfm2moe": "LFM2-MoE is not implemented yet; use a dense LFM2 GGUF (architecture 'lfm2')",
    **dict.fromkeys(("phi", "phi2"),
                    "Phi-2's parallel attention/MLP block with LayerNorm is not supported; use a "
                    "Phi-3 or Phi-4 GGUF (architecture 'phi3')"),
}


def kind_of(architecture: str) -> str:
    """The manifest kind an architecture serves: "embedding" (encoders) or "generator"."""
    return getattr(ARCHITECTURES[resolve(architecture)], "KIND", "generator")


def resolve(name: str) -> str:
    """The canonical architecture for a declared name; raises UnsupportedArchitecture."""
    key = (name or "").strip().lower()
    if key in REFUSED:
        raise UnsupportedArchitecture(key, reason=REFUSED[key])
    if key not in ALIASES:
        raise UnsupportedArchitecture(key or "<none>", known=sorted(ALIASES))
    return ALIASES[key]
