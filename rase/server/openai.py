"""The OpenAI-compatible routes (and llama-server's /tokenize, /detokenize) over one Engine, as
a router that create_app composes beside Ollama's.

Every request becomes a RequestHandle on its model's worker (which batches concurrent
requests); loading, templating and tokenizing run in the thread pool (run_in_threadpool), and the
event loop only awaits the handle. A client that disconnects (or a dropped request) cancels
generation at the next step.
"""
from __future__ import annotations

import base64
import json
import time
import uuid
from dataclasses import dataclass
from typing import Annotated, Any, AsyncIterator

from fastapi import APIRouter
from fastapi import Path as FastAPIPath
from fastapi.responses import StreamingResponse
from starlette.concurrency import run_in_threadpool

from ..engine.logprobs import chat_logprobs, completion_logprobs
from ..errors import InvalidRequest, ModelNotLoaded, RaseError
from .defaults import ServeDefaults, budget
from .errors import error_body, status_of
from .schemas import (MODEL_ID_PATTERN, ChatRequest, CompletionRequest, DetokenizeRequest, EmbeddingsRequest,
                      ModelRequest, TokenizeRequest)


def router(engine, metrics, defaults: ServeDefaults) -> APIRouter:
    """/v1/models, /v1/chat/completions, /v1/completions, /v1/embeddings, /tokenize, /detokenize."""
    api = APIRouter()
    _model_routes(api, engine)
    _generation_routes(api, engine, metrics, defaults)
    return api


def _model_routes(api: APIRouter, engine) -> None:
    """What reads a model without generating: its cards, its vocabulary, its embeddings."""

    @api.get("/v1/models")
    async def models():
        return {"object": "list", "data": [_model_card(m, engine.status(m.id)) for m in engine.registry.list()]}

    @api.get("/v1/models/{model_id}")
    async def model(model_id: Annotated[str, FastAPIPath(pattern=MODEL_ID_PATTERN)]):
        return _model_card(engine.registry.get(model_id), engine.status(model_id))

    @api.post("/models/load")
    async def load(req: ModelRequest):
        """llama-server's router: load a model now (it stays loaded as --keep-alive says)."""
        engine.registry.get(req.model)
        await run_in_threadpool(engine.load, req.model)
        return {"success": True}

    @api.post("/models/unload")
    async def unload(req: ModelRequest):
        engine.registry.get(req.model)
        if not await run_in_threadpool(engine.unload, req.model):
            raise ModelNotLoaded(f"model {req.model!r} is not loaded", "model")
        return {"success": True}

    def model_of(name: str | None) -> str:
        if name is not None:
            return engine.registry.get(name).id  # 404 for an unknown model
        ids = [m.id for m in engine.registry.list()]
        if len(ids) != 1:
            raise InvalidRequest(f"model is required: the store holds {len(ids)} models", "model")
        return ids[0]

    @api.post("/tokenize")
    async def tokenize(req: TokenizeRequest):
        out = await run_in_threadpool(lambda: engine.tokenize(
            model_of(req.model), req.content, add_special=req.add_special, parse_special=req.parse_special,
            with_pieces=req.with_pieces))
        if req.with_pieces:  # a piece that is not whole UTF-8 is given as its bytes, as llama-server does
            out = [{"id": i, "piece": _piece(b)} for i, b in out]
        return {"tokens": out}

    @api.post("/detokenize")
    async def detokenize(req: DetokenizeRequest):
        return {"content": await run_in_threadpool(lambda: engine.detokenize(model_of(req.model), req.tokens))}

    @api.post("/v1/embeddings")
    async def embeddings(req: EmbeddingsRequest):
        if req.dimensions is not None:
            raise InvalidRequest("dimensions is not supported: embeddings have the model's own width", "dimensions")
        engine.registry.get(req.model)
        vectors, n_tokens = await run_in_threadpool(engine.embed, req.model, req.input)
        data = [{"object": "embedding", "index": i,
                 "embedding": base64.b64encode(v.astype("<f4").tobytes()).decode()
                 if req.encoding_format == "base64" else v.tolist()} for i, v in enumerate(vectors)]
        return {"object": "list", "data": data, "model": req.model,
                "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens}}


def _generation_routes(api: APIRouter, engine, metrics, defaults: ServeDefaults) -> None:
    """Chat and text completions, whole or streamed as server-sent events."""

    @api.post("/v1/chat/completions")
    async def chat(req: ChatRequest):
        kw = req.generation_kwargs()
        if req.max_completion_tokens and "max_tokens" not in kw:
            kw["max_tokens"] = req.max_completion_tokens
        messages = [m.model_dump(exclude_none=True) for m in req.messages]
        if req.reasoning_effort is not None:
            kw["reasoning_effort"] = req.reasoning_effort
        kw["think"] = defaults.think(req.reasoning_format)
        kw["reasoning_budget"] = budget(req.reasoning_budget_tokens, req.thinking_budget_tokens)
        if req.chat_template_kwargs is not None:
            kw["chat_template_kwargs"] = req.chat_template_kwargs
        return await respond(req, lambda: engine.submit_chat_choices(
            req.model, messages, req.n, stop=req.stop, **kw, **req.structure_kwargs(), **req.tool_kwargs(),
            **req.logprob_kwargs()), chat=True)

    @api.post("/v1/completions")
    async def completions(req: CompletionRequest):
        prompt = req.prompt
        if isinstance(prompt, list) and isinstance(prompt[0], str):
            if len(prompt) != 1:
                raise InvalidRequest("prompt: exactly one prompt per request is supported")
            prompt = prompt[0]
        return await respond(req, lambda: engine.submit_complete_choices(
            req.model, prompt, req.n, stop=req.stop, **req.generation_kwargs(), **req.structure_kwargs(),
            **req.logprob_kwargs()), chat=False)

    async def respond(req, submit, chat: bool):
        engine.registry.get(req.model)  # 404 before anything else
        # loading the model (first use), the template and the tokenizer run in the thread pool;
        # errors here (context overflow, bad config) are answered as 4xx before any streaming
        handles = await run_in_threadpool(submit)
        reply = _Reply(f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}", int(time.time()), req.model, chat)
        if not req.stream:
            try:
                outs = [await h.aresult() for h in handles]
            finally:
                for h in handles:
                    h.cancel()
            metrics.finished(req.model, outs)
            return _response(reply, outs)
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        return StreamingResponse(_sse(handles, reply, include_usage, lambda outs: metrics.finished(req.model, outs)),
                                 media_type="text/event-stream")


def _piece(b: bytes):
    try:
        return b.decode("utf-8")
    except UnicodeDecodeError:
        return list(b)


def _model_card(m, status: str) -> dict:
    """status: loaded, loading or unloaded (llama-server's router reports it so)."""
    return {"id": m.id, "object": "model", "created": 0, "owned_by": "rase",
            "architecture": m.architecture, "context_length": m.context_length, "status": {"value": status},
            "input_modalities": ["text", "image"] if m.mmproj else ["text"]}  # llama-server's name


@dataclass(frozen=True)
class _Reply:
    """What every response or chunk of one request repeats."""
    id: str
    created: int
    model: str
    chat: bool

    def envelope(self, stream: bool) -> dict[str, Any]:
        obj = ("chat.completion.chunk" if stream else "chat.completion") if self.chat else "text_completion"
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}


def _usage(outs) -> dict:
    """One prompt, every choice's completion tokens."""
    prompt, done = outs[0].prompt_tokens, sum(o.completion_tokens for o in outs)
    return {"prompt_tokens": prompt, "completion_tokens": done, "total_tokens": prompt + done,
            "prompt_tokens_details": {"cached_tokens": outs[0].cached_tokens},
            "completion_tokens_details": {"reasoning_tokens": sum(o.reasoning_tokens for o in outs)}}


def _finish(reason: str) -> str:
    return reason if reason in ("stop", "length", "tool_calls") else "stop"


def _call(c) -> dict:
    return {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}


def _logprobs(reply: _Reply, entries) -> dict | None:
    if entries is None:
        return None
    return chat_logprobs(entries) if reply.chat else completion_logprobs(entries)


def _choice(reply: _Reply, index: int, out) -> dict:
    choice: dict[str, Any] = {"index": index, "finish_reason": _finish(out.finish_reason),
                              "logprobs": _logprobs(reply, out.logprobs)}
    if reply.chat:
        choice["message"] = {"role": "assistant", "content": out.text}
        if out.tool_calls:
            choice["message"] = {"role": "assistant", "content": out.text or None,
                                 "tool_calls": [_call(c) for c in out.tool_calls]}
        if out.reasoning:  # llama-server's and DeepSeek's field for a separated reasoning
            choice["message"]["reasoning_content"] = out.reasoning
    else:
        choice["text"] = out.text
    return choice


def _response(reply: _Reply, outs: list) -> dict:
    return {**reply.envelope(stream=False), "choices": [_choice(reply, i, o) for i, o in enumerate(outs)],
            "usage": _usage(outs), "timings": outs[0].timings}


def _chunk(reply: _Reply, delta: dict | str | None, finish: str | None = None, usage: dict | None = None,
           logprobs: dict | None = None, index: int = 0, timings: dict | None = None) -> str:
    body = reply.envelope(stream=True)
    body["choices"] = []
    if delta is not None or finish is not None:
        c: dict[str, Any] = {"index": index, "finish_reason": finish, "logprobs": logprobs}
        if reply.chat:
            c["delta"] = delta if isinstance(delta, dict) else {}
        else:
            c["text"] = delta if isinstance(delta, str) else ""
        body["choices"] = [c]
    if timings is not None:  # llama-server's per-request figures, on the last chunk of a choice
        body["timings"] = timings
    if usage is not None:
        body["usage"] = usage
    return f"data: {json.dumps(body)}\n\n"


async def _sse(handles, reply: _Reply, include_usage: bool, on_done=lambda outs: None) -> AsyncIterator[str]:
    """Deltas from the handles as server-sent events, choice after choice (each chunk says its
    index; the choices generate together meanwhile). Closing the generator (client gone)
    cancels every request."""
    try:
        outs = []
        for i, handle in enumerate(handles):
            if reply.chat:
                yield _chunk(reply, {"role": "assistant", "content": ""}, index=i)
            try:
                async for out in handle.aoutputs():
                    for chunk in _output_chunks(reply, out, i):
                        yield chunk
                outs.append(await handle.aresult())
            except RaseError as exc:
                status, kind = status_of(exc)
                yield f"data: {json.dumps(error_body(str(exc), kind))}\n\n"
                yield "data: [DONE]\n\n"
                return
            yield _chunk(reply, {} if reply.chat else "", _finish(outs[-1].finish_reason), index=i,
                         timings=outs[-1].timings)
        on_done(outs)
        if include_usage:
            yield _chunk(reply, None, None, _usage(outs))
        yield "data: [DONE]\n\n"
    finally:
        for handle in handles:
            handle.cancel()


def _output_chunks(reply: _Reply, out, index: int) -> list[str]:
    """One output.Output as chunks: its reasoning (llama-server's reasoning_content), its text,
    each tool call (id, type and name once per index), its logprobs."""
    chunks = [_chunk(reply, {"reasoning_content": out.reasoning}, index=index)] if out.reasoning else []
    if out.text:
        chunks.append(_chunk(reply, {"content": out.text} if reply.chat else out.text, index=index))
    chunks += [_chunk(reply, {"tool_calls": [{"index": c.index, **_call(c)}]}, index=index) for c in out.calls]
    if out.logprobs:
        chunks.append(_chunk(reply, {"content": ""} if reply.chat else "", logprobs=_logprobs(reply, out.logprobs),
                             index=index))
    return chunks
