"""Architectures, keyed by GGUF `general.architecture` (and the manual's aliases)."""
from __future__ import annotations

from types import ModuleType

from ..errors import UnsupportedArchitecture
from . import gemma3, llama, qwen3

ARCHITECTURES: dict[str, ModuleType] = {"llama": llama, "qwen3": qwen3, "gemma3": gemma3}

ALIASES: dict[str, str] = {
    "llama": "llama", "llama2": "llama", "llama3": "llama", "llama-gguf": "llama",
    "mistral": "llama", "mixtral": "llama", "qwen3": "qwen3", "qwen3-gguf": "qwen3",
    "gemma3": "gemma3",
}

REFUSED: dict[str, str] = {
    **dict.fromkeys(("qwen", "qwen2", "qwen2.5", "qwen2-gguf"),
                    "Qwen2 support was replaced by Qwen3; use a Qwen3 GGUF (architecture 'qwen3')"),
    **dict.fromkeys(("phi", "phi2", "phi3", "phi4"),
                    "Phi GGUF is not yet enabled; use a llama, qwen3 or gemma3 GGUF"),
}


def resolve(name: str) -> str:
    """The canonical architecture for a declared name; raises UnsupportedArchitecture."""
    key = (name or "").strip().lower()
    if key in REFUSED:
        raise UnsupportedArchitecture(key, reason=REFUSED[key])
    if key not in ALIASES:
        raise UnsupportedArchitecture(key or "<none>", known=sorted(ALIASES))
    return ALIASES[key]
