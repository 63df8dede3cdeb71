"""The published OpenAPI document says what the server does: every error status it answers
(in OpenAI's error shape; validation failures are 400s, never FastAPI's 422), the streamed and
non-JSON media types, and the constraints it enforces (model id pattern, ranges from the
request models)."""
from __future__ import annotations

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

ERROR = {"type": "object", "required": ["error"], "properties": {"type": {"const": "error"}, "error": {
    "type": "object", "required": ["message", "type"], "properties": {
        "message": {"type": "string"}, "type": {"type": "string"},
        "param": {"type": ["string", "null"]}, "code": {"type": ["string", "null"]}}}}}
ERRORS = {  # status -> when; every route may meet the guards (403, 413, 401)
    "400": "malformed body, unsupported field or value, context overflow",
    "401": "missing or wrong API key (rase serve --api-key)",
    "403": "Host or browser origin refused",
    "404": "unknown model or route",
    "413": "body over the size limit",
    "429": "the model's waiting queue is full; see Retry-After",
    "503": "the model's files are missing or fail verification",
}
# route -> extra media types of its 200 answer
MEDIA = {
    "/v1/chat/completions": {"text/event-stream": {"schema": {"type": "string"}}},
    "/v1/completions": {"text/event-stream": {"schema": {"type": "string"}}},
    "/v1/responses": {"text/event-stream": {"schema": {"type": "string"}}},
    "/v1/messages": {"text/event-stream": {"schema": {"type": "string"}}},
    "/api/chat": {"application/x-ndjson": {"schema": {"type": "string"}}},
    "/api/generate": {"application/x-ndjson": {"schema": {"type": "string"}}},
    "/metrics": {"text/plain": {"schema": {"type": "string"}}},
    "/": {"text/html": {"schema": {"type": "string"}}},
    "/web/{name}": {"text/html": {"schema": {"type": "string"}}, "text/css": {"schema": {"type": "string"}},
                    "text/javascript": {"schema": {"type": "string"}}},
}
ONLY_MEDIA = ("/metrics", "/", "/web/{name}")  # not JSON at all when they succeed


def document(app: FastAPI) -> None:
    def openapi() -> dict:
        if app.openapi_schema is None:
            app.openapi_schema = _amend(get_openapi(title=app.title, version=app.version, routes=app.routes))
        return app.openapi_schema

    app.openapi = openapi


def _amend(doc: dict) -> dict:
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
