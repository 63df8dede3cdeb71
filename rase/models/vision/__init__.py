"""Vision encoders from `mmproj` files, one small description per projector type over the
shared ViT pieces (models/vision/vit.py). PROJECTORS: projector type -> its module (CAUSAL, and an
Encoder with tokens(image), layout(image): the prompt around its rows, embed(image): the rows)."""
from __future__ import annotations

from . import gemma3, idefics3, lfm2, qwen3vl, qwen25vl
from .clip import Tensors, VisionParams, vision_params

PROJECTORS = {"gemma3": gemma3, "idefics3": idefics3, "lfm2": lfm2, "qwen3vl_merger": qwen3vl,
              "qwen2.5vl_merger": qwen25vl}


def load_encoder(g):
    """An mmproj file's encoder: checked, its tensors read once (an unread tensor is refused)."""
    vp = vision_params(g, tuple(PROJECTORS))
    module = PROJECTORS[vp.projector]
    ts = Tensors(g)
    enc = module.Encoder(ts, vp)
    if ts.unused():
        from ...errors import CorruptModelFile

        raise CorruptModelFile(g.path, f"mmproj tensors rase does not know for {vp.projector}: "
                                       f"{', '.join(ts.unused()[:5])}")
    return module, enc


__all__ = ["PROJECTORS", "Tensors", "VisionParams", "load_encoder", "vision_params"]
