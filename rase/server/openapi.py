"""The published OpenAPI document says what the server does: every error status it answers
(in OpenAI's error shape; validation failures are 400s, never FastAPI's 422), the streamed and
non-JSON media types, and the constraints it enforces (model id pattern, ranges from the
request models)."""
from __future__ import annotations

import os

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from ..errors import RaseError

ERROR = {"type": "object", "required": ["error"], "properties": {"type": {"const": "error"}, "error": {
    "type": "object", "required": ["message", "type"], "properties": {
        "message": {"type": "string"}, "type": {"type": "string"},
        "param": {"type": ["string", "null"]}, "code": {"type": ["string", "null"]}}}}}
ERRORS = {  # status -> when; every route may meet the guards (403, 413, 401)
    "400": "malformed body, unsupported field or value, context overflow",
    "401": "missing or wrong API key (rase serve --api-key)",
    "403": "Host or browser origin refused",
    "404": "unknown model or route",
    "409": "an unload of a model that is not loaded",
    "413": "body over the size limit",
    "429": "the model's waiting queue is full; see Retry-After",
    "503": "the model's files are missing or fail verification",
}
# a stream's events: each data line is a JSON object (a chunk, a typed event) or [DONE]
SSE = {"schema": {"description": "server-sent events"}}
# route -> extra media types of its 200 answer
MEDIA = {
    "/v1/chat/completions": {"text/event-stream": SSE},
    "/v1/completions": {"text/event-stream": SSE},
    "/v1/responses": {"text/event-stream": SSE},
    "/v1/messages": {"text/event-stream": SSE},
    "/api/chat": {"application/x-ndjson": {"schema": {"type": "string"}}},
    "/api/generate": {"application/x-ndjson": {"schema": {"type": "string"}}},
    "/metrics": {"text/plain": {"schema": {"type": "string"}}},
    "/": {"text/html": {"schema": {"type": "string"}}},
    "/web/{name}": {"text/html": {"schema": {"type": "string"}}, "text/css": {"schema": {"type": "string"}},
                    "text/javascript": {"schema": {"type": "string"}}},
}
ONLY_MEDIA = ("/metrics", "/", "/web/{name}")  # not JSON at all when they succeed


# (component, property path) -> what bounds it: the server's max_tokens limit
MAX_TOKENS = [("ChatRequest", "max_tokens"), ("ChatRequest", "max_completion_tokens"),
              ("CompletionRequest", "max_tokens"), ("ResponsesRequest", "max_output_tokens"),
              ("MessagesRequest", "max_tokens"), ("Options", "num_predict")]


def document(app: FastAPI, engine=None) -> None:
    """The document is rebuilt when what it states about the store changes (the ids, whether one
    vocabulary size holds for all, the max_tokens limit)."""
    built: dict = {}

    def openapi() -> dict:
        facts = store_facts(engine, built.setdefault("vocab", {})) if engine is not None else None
        if built.get("facts") != facts or "doc" not in built:
            doc = _amend(get_openapi(title=app.title, version=app.version, routes=app.routes))
            built.update(facts=facts, doc=_state(doc, facts) if facts else doc)
        return built["doc"]

    app.openapi = openapi


def store_facts(engine, vocab_cache: dict) -> tuple:
    """(model ids, the one vocabulary size they share or None, the max_tokens limit)."""
    from ..store.gguf import GGUFFile

    ids, sizes = [], set()
    for m in engine.registry.list():
        ids.append(m.id)
        try:
            st = os.stat(m.weights)
            key = (m.weights, st.st_size, st.st_mtime_ns)
            if key not in vocab_cache:
                vocab_cache[key] = len(GGUFFile(m.weights).metadata.get("tokenizer.ggml.tokens") or ())
            sizes.add(vocab_cache[key])
        except (OSError, RaseError):
            sizes.add(None)
    vocab = sizes.pop() if len(sizes) == 1 else None
    return tuple(ids), vocab or None, getattr(engine, "max_tokens_limit", None)


def below(n: int) -> str:
    """A regex of the decimal integers 0 .. n-1 (n >= 1), no leading zeros."""
    hi = str(n - 1)
    if len(hi) == 1:
        return f"^[0-{hi}]$"
    parts = ["[0-9]"] + [f"[1-9][0-9]{{{k - 1}}}" for k in range(2, len(hi))]
    for i, d in enumerate(int(c) for c in hi):
        lo = 1 if i == 0 else 0
        if d > lo:
            parts.append(hi[:i] + f"[{lo}-{d - 1}]" + "[0-9]" * (len(hi) - i - 1))
    parts.append(hi)
    return "^(?:" + "|".join(parts) + ")$"


def _state(doc: dict, facts: tuple) -> dict:
    """What the store makes exact: a model id is required where the store holds other than one
    model; token ids stay below the shared vocabulary; max_tokens within the server's limit."""
    ids, vocab, limit = facts
    schemas = doc["components"]["schemas"]
    if len(ids) != 1:
        for name in ("TokenizeRequest", "DetokenizeRequest"):
            s = schemas[name]
            s["required"] = sorted(set(s.get("required", [])) | {"model"})
            s["properties"]["model"] = next(a for a in s["properties"]["model"]["anyOf"] if a.get("type") == "string")
    if vocab:
        schemas["DetokenizeRequest"]["properties"]["tokens"]["items"]["maximum"] = vocab - 1
        for name in ("ChatRequest", "CompletionRequest"):
            bias = next(a for a in schemas[name]["properties"]["logit_bias"]["anyOf"] if a.get("type") == "object")
            bias["propertyNames"] = {"pattern": below(vocab)}
        for alt in schemas["CompletionRequest"]["properties"]["prompt"]["anyOf"]:
            if alt.get("items", {}).get("type") == "integer":
                alt["items"]["maximum"] = vocab - 1
    if limit:
        for name, prop in MAX_TOKENS:
            field = schemas[name]["properties"][prop]
            for alt in field.get("anyOf", [field]):
                if alt.get("type") == "integer":
                    alt["maximum"] = limit
    return doc


# pydantic writes a bound behind a validator function (schemas.Int) under its own name
BOUNDS = {"ge": "minimum", "le": "maximum", "gt": "exclusiveMinimum", "lt": "exclusiveMaximum"}


def _bounds(node) -> None:
    """Integer bounds under JSON Schema's names, throughout the document."""
    if isinstance(node, dict):
        if node.get("type") == "integer":
            for ours, theirs in BOUNDS.items():
                if ours in node:
                    node[theirs] = node.pop(ours)
        for v in node.values():
            _bounds(v)
    elif isinstance(node, list):
        for v in node:
            _bounds(v)


def _amend(doc: dict) -> dict:
    _bounds(doc.get("components", {}))
    doc.setdefault("components", {}).setdefault("schemas", {})["Error"] = ERROR
    ref = {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}
    for path, ops in doc.get("paths", {}).items():
        for op in ops.values():
            responses = op.setdefault("responses", {})
            responses.pop("422", None)
            for status, why in ERRORS.items():
                responses.setdefault(status, {"description": why, "content": ref})
            ok = responses.setdefault("200", {"description": "OK"})
            content = ok.setdefault("content", {})
            if path in ONLY_MEDIA:
                content.clear()
            content.update(MEDIA.get(path, {}))
    doc.get("components", {}).get("schemas", {}).pop("HTTPValidationError", None)
    doc.get("components", {}).get("schemas", {}).pop("ValidationError", None)
    return doc
