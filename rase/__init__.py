"""rase: an embeddable local LLM runtime for Python.

Data path: store (registry, GGUF reader, plan) -> session (plan, tokenizer, templates, worker)
-> engine (worker, scheduler, KV manager, channel) -> models -> kernels (nogil), with text
(tokenizer, templates, text state, structured output) beside the engine; surfaces on top: api,
cli, server, integrations.
"""
from __future__ import annotations

from .kernels import _kernels
from .config import PREFETCH_ENV, SIMD_ENV, prefetch_request, simd_request
from .errors import (
    BackendUnavailable, Cancelled, ChatTemplateError, ContextOverflow, CorruptModelFile, HubDownloadError,
    IntegrityMismatch, InvalidGenerationConfig, InvalidGrammar, InvalidImage, InvalidLogits, InvalidModelId,
    InvalidRequest, ManifestError, NoVisionEncoder,
    MissingDependency, ModelFileNotFound,
    ModelNotFound, Overloaded, ResponseNotFound, RaseError, StoreWriteError, TokenizerError, UnsafeCheckpoint,
    UnsupportedArchitecture, UnsupportedFormat,
    UnsupportedQuantType, WrongModelKind,
)
from .convert import convert_model
from .store.gguf import GGUFFile, TensorInfo
from .kernels.quants import QuantType, dequantize

__version__ = "0.1.0"


def _apply_env(var: str, wanted: str | None, apply, default, advice: str) -> None:
    """apply(wanted), or apply(default()) when the variable is unset; a value apply refuses
    (ValueError) is a BackendUnavailable naming the variable and what to use instead."""
    if wanted is None:
        apply(default())
        return
    try:
        apply(wanted)
    except ValueError as exc:
        raise BackendUnavailable(f"{var}={wanted!r} cannot be used here ({exc}); {advice}") from None


def _select_kernels() -> None:
    """The ISA path and the weight prefetch distance, once at import (RASE_SIMD, RASE_PREFETCH)."""
    _apply_env(SIMD_ENV, simd_request(), _kernels.set_isa, _kernels.isa_best,
               f"available: {', '.join(_kernels.isa_supported())}")
    _apply_env(PREFETCH_ENV, prefetch_request(), lambda v: _kernels.set_prefetch(int(v)), _kernels.prefetch_default,
               "use 0 to turn software prefetch off, a distance such as 4096, or unset it for this CPU's default")


def build_info() -> dict:
    """How this build was compiled and which kernel path runs on this CPU."""
    import numpy

    info = dict(_kernels.compiler_info())
    info.update(
        version=__version__,
        isa_compiled=_kernels.isa_compiled(),
        isa_supported=_kernels.isa_supported(),
        isa_selected=_kernels.get_isa(),
        cpu_vendor=_kernels.cpu_vendor(),
        prefetch_bytes=_kernels.get_prefetch(),
        numpy=numpy.__version__,
    )
    return info


_select_kernels()

# The manual's module functions and the Engine, importable as rase.X; loaded on first use so that
# `import rase` stays light (no tokenizers/jinja2 until a model is used).
_API = (
    "Engine", "Completion", "pull_model", "import_model", "attach_tokenizer", "list_models",
    "inspect_model", "verify_model", "unload_models", "generate_registered_gguf",
    "generate_chat_registered_gguf", "generate_chat_stream_registered_gguf", "generate_llama_gguf",
    "profiling_snapshot", "gpu_info", "probe_runtime", "load_gguf_decoder",
)
_HOME = {"load_gguf_decoder": "engine.decoder"}  # the single-stream scorer (prefill/decode -> logits); else api


def __getattr__(name: str):
    if name in _API:
        import importlib

        return getattr(importlib.import_module(f".{_HOME.get(name, 'api')}", __name__), name)
    raise AttributeError(f"module 'rase' has no attribute {name!r}")


__all__ = [
    "BackendUnavailable", "Cancelled", "ChatTemplateError", "ContextOverflow", "CorruptModelFile", "GGUFFile",
    "HubDownloadError", "IntegrityMismatch", "InvalidGenerationConfig", "InvalidGrammar", "InvalidImage",
    "InvalidLogits", "NoVisionEncoder",
    "InvalidModelId", "InvalidRequest", "ManifestError", "MissingDependency", "ModelFileNotFound", "ModelNotFound", "Overloaded", "ResponseNotFound", "QuantType", "RaseError", "StoreWriteError",
    "TensorInfo", "TokenizerError", "UnsupportedArchitecture", "UnsupportedFormat",
    "UnsafeCheckpoint", "UnsupportedQuantType", "WrongModelKind", "__version__", "build_info", "convert_model",
    "dequantize", *_API,
]
