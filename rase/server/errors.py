"""RaseError classes -> HTTP status and OpenAI error type (by class, never by message)."""
from __future__ import annotations

from .. import errors as E

STATUS: dict[type, tuple[int, str]] = {
    E.ModelNotFound: (404, "model_not_found"),
    E.ResponseNotFound: (404, "not_found_error"),
    E.ModelUnloaded: (503, "model_unavailable"),
    E.ModelNotLoaded: (409, "invalid_request_error"),
    E.InvalidModelId: (400, "invalid_request_error"),
    E.InvalidRequest: (400, "invalid_request_error"),  # InvalidGenerationConfig, WrongModelKind, InvalidGrammar
    E.ContextOverflow: (400, "context_length_exceeded"),
    E.ChatTemplateError: (400, "invalid_request_error"),
    E.TokenizerError: (400, "invalid_request_error"),
    E.UnsupportedArchitecture: (400, "invalid_request_error"),
    E.UnsupportedFormat: (400, "invalid_request_error"),
    E.BackendUnavailable: (400, "invalid_request_error"),
    E.ModelFileNotFound: (503, "model_unavailable"),
    E.IntegrityMismatch: (503, "model_unavailable"),
    E.CorruptModelFile: (503, "model_unavailable"),
    E.ManifestError: (503, "model_unavailable"),
    E.Cancelled: (499, "cancelled"),
    E.Overloaded: (429, "rate_limit_error"),
}


def status_of(exc: BaseException) -> tuple[int, str]:
    for cls in type(exc).__mro__:
        if cls in STATUS:
            return STATUS[cls]
    return 500, "server_error"


def error_body(message: str, kind: str, code: str | None = None, param: str | None = None) -> dict:
    # OpenAI's shape; the top-level type is Anthropic's, so both clients read it
    return {"type": "error", "error": {"message": message, "type": kind, "param": param, "code": code}}
