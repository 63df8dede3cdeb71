"""create_app(engine): the OpenAI-compatible routes over one Engine; no module-level state.

Generation runs in worker threads (the event loop never blocks); a client that disconnects
mid-stream cancels generation at the next token.
"""
from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from typing import Any, AsyncIterator

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.middleware.base import BaseHTTPMiddleware

from ..errors import RaseError
from .errors import error_body, status_of
from .schemas import ChatRequest, CompletionRequest

MAX_BODY = 1 << 20  # 1 MiB of JSON is far more than any prompt a local model takes


def create_app(engine, api_key: str | None = None, max_body: int = MAX_BODY) -> FastAPI:
    app = FastAPI(title="rase", version=__import__("rase").__version__)
    app.state.engine = engine

    @app.middleware("http")
    async def guard(request: Request, call_next):
        length = request.headers.get("content-length")
        if length is not None and (not length.isdigit() or int(length) > max_body):
            return JSONResponse(error_body(f"request body over {max_body} bytes", "invalid_request_error"), 413)
        if api_key and request.url.path.startswith("/v1/"):
            if request.headers.get("authorization") != f"Bearer {api_key}":
                return JSONResponse(error_body("invalid or missing API key", "authentication_error"), 401)
        return await call_next(request)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError):
        first = exc.errors()[0] if exc.errors() else {}
        if first.get("type") == "json_invalid":
            return JSONResponse(error_body(f"request body is not valid JSON ({first.get('msg')})",
                                           "invalid_request_error"), 400)
        where = ".".join(str(p) for p in first.get("loc", ()) if p != "body")
        msg = f"{where}: {first.get('msg', 'invalid request')}" if where else "invalid request body"
        return JSONResponse(error_body(msg, "invalid_request_error", param=where or None), 400)

    @app.exception_handler(RaseError)
    async def rase_error(request: Request, exc: RaseError):
        status, kind = status_of(exc)
        return JSONResponse(error_body(str(exc), kind), status)

    @app.get("/health")
    async def health():
        return {"status": "ok", **engine.stats}

    def model_card(m) -> dict:
        return {"id": m.id, "object": "model", "created": 0, "owned_by": "rase",
                "architecture": m.architecture, "context_length": m.context_length}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [model_card(m) for m in engine.registry.list()]}

    @app.get("/v1/models/{model_id}")
    async def model(model_id: str):
        return model_card(engine.registry.get(model_id))

    @app.post("/v1/chat/completions")
    async def chat(req: ChatRequest, request: Request):
        kw = req.generation_kwargs()
        if req.max_completion_tokens and "max_tokens" not in kw:
            kw["max_tokens"] = req.max_completion_tokens
        messages = [m.model_dump() for m in req.messages]
        start = lambda cancel, push: engine.chat(req.model, messages, stop=req.stop, on_delta=push,
                                                 cancelled=cancel, **kw)
        return await _respond(request, req, start, chat=True)

    @app.post("/v1/completions")
    async def completions(req: CompletionRequest, request: Request):
        prompt = req.prompt
        if isinstance(prompt, list):
            if len(prompt) != 1:
                raise_invalid("prompt: exactly one prompt per request is supported")
            prompt = prompt[0]
        start = lambda cancel, push: engine.complete(req.model, prompt, stop=req.stop, on_delta=push,
                                                     cancelled=cancel, **req.generation_kwargs())
        return await _respond(request, req, start, chat=False)

    async def _respond(request: Request, req, start, chat: bool):
        engine.registry.get(req.model)  # 404 before any streaming starts
        rid = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        created = int(time.time())
        if not req.stream:
            stop = threading.Event()
            fut = asyncio.get_running_loop().run_in_executor(None, lambda: start(stop.is_set, None))
            try:
                out = await asyncio.shield(fut)
            except asyncio.CancelledError:
                stop.set()
                raise
            usage = {"prompt_tokens": out.prompt_tokens, "completion_tokens": out.completion_tokens,
                     "total_tokens": out.prompt_tokens + out.completion_tokens}
            choice: dict[str, Any] = {"index": 0, "finish_reason": _finish(out.finish_reason), "logprobs": None}
            if chat:
                choice["message"] = {"role": "assistant", "content": out.text}
            else:
                choice["text"] = out.text
            return {"id": rid, "object": "chat.completion" if chat else "text_completion",
                    "created": created, "model": req.model, "choices": [choice], "usage": usage}
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        return StreamingResponse(_sse(request, start, rid, created, req.model, chat, include_usage),
                                 media_type="text/event-stream")

    async def _sse(request: Request, start, rid: str, created: int, model: str, chat: bool,
                   include_usage: bool) -> AsyncIterator[str]:
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()
        stop = threading.Event()
        end = object()

        def push(delta: str) -> None:
            loop.call_soon_threadsafe(queue.put_nowait, delta)

        def work():
            try:
                return start(stop.is_set, push)
            finally:
                loop.call_soon_threadsafe(queue.put_nowait, end)

        obj = "chat.completion.chunk" if chat else "text_completion"

        def chunk(delta: dict | str | None, finish: str | None = None, usage: dict | None = None) -> str:
            body: dict[str, Any] = {"id": rid, "object": obj, "created": created, "model": model}
            if delta is not None or finish is not None:
                c: dict[str, Any] = {"index": 0, "finish_reason": finish, "logprobs": None}
                if chat:
                    c["delta"] = delta if isinstance(delta, dict) else {}
                else:
                    c["text"] = delta if isinstance(delta, str) else ""
                body["choices"] = [c]
            else:
                body["choices"] = []
            if usage is not None:
                body["usage"] = usage
            return f"data: {json.dumps(body)}\n\n"

        fut = loop.run_in_executor(None, work)
        try:
            if chat:
                yield chunk({"role": "assistant", "content": ""})
            while True:
                item = await queue.get()
                if item is end:
                    break
                yield chunk({"content": item} if chat else item)
            try:
                out = await fut
            except RaseError as exc:
                status, kind = status_of(exc)
                yield f"data: {json.dumps(error_body(str(exc), kind))}\n\n"
                yield "data: [DONE]\n\n"
                return
            yield chunk({} if chat else "", _finish(out.finish_reason))
            if include_usage:
                yield chunk(None, None, {"prompt_tokens": out.prompt_tokens, "completion_tokens": out.completion_tokens,
                                         "total_tokens": out.prompt_tokens + out.completion_tokens})
            yield "data: [DONE]\n\n"
        finally:
            stop.set()  # the client went away (or we are done): stop at the next token

    return app


def _finish(reason: str) -> str:
    return reason if reason in ("stop", "length") else "stop"


def raise_invalid(message: str):
    from ..errors import InvalidGenerationConfig

    raise InvalidGenerationConfig(message)
