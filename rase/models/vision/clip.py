"""An `mmproj` GGUF (general.architecture `clip`): the vision encoder and projector that llama.cpp's
libmtmd pairs with a text model. Reads clip.vision.* with llama.cpp's exact key types
(clip.cpp: U32 sizes, F32 epsilon, F32 mean/std arrays) and the tensors by name, dequantized to
float32 once at load (F16 kept as F16 where llama.cpp computes in F16).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ...errors import CorruptModelFile, UnsupportedArchitecture
from ...kernels import _kernels
from ..base import ModelFile

U32 = ("embedding_length", "attention.head_count", "feed_forward_length", "block_count", "projection_dim",
       "image_size", "patch_size")


@dataclass(frozen=True)
class VisionParams:
    """clip.vision.*: D = width, F = FFN width, S = image side, P = patch side (pixels)."""
    projector: str
    n_embd: int
    n_head: int
    n_ff: int
    n_layer: int
    n_proj: int          # the projector's output width: the text model's input width
    image_size: int
    patch_size: int
    eps: float
    mean: tuple
    std: tuple
    act: str             # "gelu" (tanh form, through llama.cpp's table), "silu", or "quick_gelu"
    merge: int = 0       # projector.scale_factor (Gemma 3's pool side, idefics3's shuffle)
    extra: dict = field(default_factory=dict)

    @property
    def d_head(self) -> int:
        return self.n_embd // self.n_head


def _key(g: ModelFile, name: str, kind: str, default=None):
    full = f"clip.vision.{name}"
    v = g.get(full)
    if v is None:
        if default is None:
            raise CorruptModelFile(g.path, f"mmproj file lacks {full}")
        return default
    if kind == "u32" and g.value_type_name(full) != "UINT32":
        raise CorruptModelFile(g.path, f"{full} must be a UINT32 (llama.cpp refuses the file otherwise)")
    return v


def vision_params(g: ModelFile, supported: tuple[str, ...]) -> VisionParams:
    """The encoder's shape from an mmproj file; a projector rase does not run is refused by name."""
    if g.get("general.architecture") != "clip":
        raise CorruptModelFile(g.path, f"not an mmproj file (general.architecture is "
                               f"{g.get('general.architecture')!r}, expected 'clip')")
    if not g.get("clip.has_vision_encoder"):
        raise UnsupportedArchitecture("clip (audio only)", (), f"{g.path} has no vision encoder: rase reads images")
    proj = g.get("clip.vision.projector_type") or g.get("clip.projector_type")
    if proj not in supported:
        raise UnsupportedArchitecture(f"vision projector {proj!r}", supported, f"in {g.path}")
    v = {k: int(_key(g, k, "u32")) for k in U32}
    mean, std = _key(g, "image_mean", "f32"), _key(g, "image_std", "f32")
    if len(mean) < 3 or len(std) < 3 or min(abs(float(s)) for s in std[:3]) == 0:
        raise CorruptModelFile(g.path, "clip.vision.image_mean / image_std need 3 values, std non-zero")
    if v["embedding_length"] % v["attention.head_count"] or min(v.values()) < 1:
        raise CorruptModelFile(g.path, "clip.vision sizes must be positive, the width a multiple of the heads")
    act = "gelu" if g.get("clip.use_gelu") else "silu" if g.get("clip.use_silu") else "quick_gelu"
    return VisionParams(proj, v["embedding_length"], v["attention.head_count"], v["feed_forward_length"],
                        v["block_count"], v["projection_dim"], v["image_size"], v["patch_size"],
                        float(_key(g, "attention.layer_norm_epsilon", "f32")),
                        tuple(float(x) for x in mean[:3]), tuple(float(x) for x in std[:3]), act,
                        int(g.get("clip.vision.projector.scale_factor") or 0))


class Tensors:
    """An mmproj's tensors by name, each read once: float32, or float16 where kept (`f16=True`)."""

    def __init__(self, g: ModelFile) -> None:
        self.g = g
        self.used: set[str] = set()

    def has(self, name: str) -> bool:
        return name in self.g.tensors

    def get(self, name: str, shape: tuple[int, ...], f16: bool = False) -> np.ndarray:
        """The tensor in numpy order, checked against shape."""
        t = self.g.tensors.get(name)
        if t is None:
            raise CorruptModelFile(self.g.path, f"mmproj tensor {name} is missing")
        if t.shape != shape:
            raise CorruptModelFile(self.g.path, f"{name} has shape {t.shape}, expected {shape}")
        self.used.add(name)
        raw = self.g.copy(t)
        if t.ggml_type == 1:  # F16
            a = raw.view(np.float16).reshape(shape)
            return a.copy() if f16 else a.astype(np.float32)
        if t.ggml_type == 0:
            return raw.view(np.float32).reshape(shape).copy()
        if t.qtype is None:
            raise CorruptModelFile(self.g.path, f"{name} has tensor type {t.type_name}, which rase cannot read")
        out = np.empty(t.n_elements, np.float32)
        _kernels.dequantize_into(int(t.qtype), raw, out)
        out = out.reshape(shape)
        return out.astype(np.float16) if f16 else out

    def unused(self) -> list[str]:
        return sorted(set(self.g.tensors) - self.used)
