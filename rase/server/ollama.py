"""The Ollama API beside the OpenAI one, on the same engine: /api/version, /api/tags,
/api/show, /api/chat, /api/generate (NDJSON streaming by default, as Ollama does) and
/api/embed.

Ollama's `options` map onto rase's sampling fields; an option or field rase cannot honour is a
400 that names it (never silently dropped). `format` is "json" (any JSON) or a JSON schema.
"""
from __future__ import annotations

import json
import time
from datetime import datetime, timezone
from typing import Annotated, Any, Literal, Optional, Union

from fastapi import APIRouter
from fastapi.responses import StreamingResponse
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, WithJsonSchema, model_validator
from starlette.concurrency import run_in_threadpool

from .. import __version__
from ..session.submission import GEN_FIELDS
from ..errors import InvalidRequest, RaseError
from ..engine.config import parse_duration
from .errors import status_of
from .schemas import Int, Unsupported

# Ollama names carry a tag; rase ids have none, so "name:latest" (what Ollama tools send by
# default) is the id "name"; any other tag is refused by the pattern
ModelId = Annotated[str, Field(pattern=r"^[A-Za-z0-9_-]+(:latest)?$", description="a model id, optionally :latest"),
                    AfterValidator(lambda name: name.removesuffix(":latest"))]

# Ollama option -> rase generation keyword
OPTIONS = {"temperature": "temperature", "top_k": "top_k", "top_p": "top_p", "min_p": "min_p", "seed": "seed",
           "num_predict": "max_tokens", "repeat_penalty": "repeat_penalty", "presence_penalty": "presence_penalty",
           "frequency_penalty": "frequency_penalty"}


class Options(BaseModel):
    """The Ollama options rase maps (any other is a 400 naming it)."""
    model_config = ConfigDict(extra="forbid", strict=True)
    temperature: Optional[float] = Field(default=None, ge=0.0, le=5.0)
    top_k: Optional[Int] = Field(default=None, ge=0)
    top_p: Optional[float] = Field(default=None, gt=0.0, le=1.0)
    min_p: Optional[float] = Field(default=None, ge=0.0, le=1.0)
    seed: Optional[Int] = Field(default=None, ge=0)
    # -1: until the context is full; 0 generates nothing, which rase refuses
    num_predict: Annotated[Optional[Int], Field(ge=-1), WithJsonSchema({"anyOf": [
        {"type": "integer", "minimum": -1, "not": {"const": 0}}, {"type": "null"}]})] = None
    repeat_penalty: Optional[float] = Field(default=None, gt=0.0)
    presence_penalty: Optional[float] = Field(default=None, ge=-2.0, le=2.0)
    frequency_penalty: Optional[float] = Field(default=None, ge=-2.0, le=2.0)
    stop: Optional[Union[Annotated[str, Field(min_length=1)], list[Annotated[str, Field(min_length=1)]]]] = None
    grammar: Optional[Annotated[str, Field(min_length=1)]] = None  # rase's extension, as on /v1: Lark or GBNF


class _Base(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    model: ModelId
    stream: bool = True
    format: Optional[Union[Literal["json"], dict[str, Any]]] = None  # "json" or a JSON schema
    options: Optional[Options] = None
    think: Optional[Union[bool, Literal["low", "medium", "high"]]] = None  # a level: gpt-oss's reasoning effort
    # how long the model stays loaded after this request: seconds or a duration ("5m"); 0 unloads, -1 keeps
    keep_alive: Optional[Union[float, str]] = None


class CallFunction(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    name: str
    arguments: dict[str, Any] = {}
    index: Optional[Int] = None


class ToolCall(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    function: CallFunction


class Message(BaseModel):
    """An Ollama chat message; images (base64, for a model with a vision encoder) go before its
    text, as Ollama places them; only an assistant's carries tool calls, only a tool's a tool_name."""
    model_config = ConfigDict(extra="forbid", strict=True, json_schema_extra={"allOf": [
        {"if": {"required": ["tool_calls"], "properties": {"tool_calls": {"type": "array", "minItems": 1}}},
         "then": {"properties": {"role": {"const": "assistant"}}}},
        {"if": {"required": ["thinking"], "properties": {"thinking": {"type": "string", "minLength": 1}}},
         "then": {"properties": {"role": {"const": "assistant"}}}}]})
    role: Literal["system", "user", "assistant", "tool"]
    content: str = ""
    thinking: Optional[str] = None       # an earlier answer's reasoning
    tool_calls: Optional[list[ToolCall]] = None
    tool_name: Optional[str] = None      # a tool result's function
    images: Optional[list[str]] = None  # base64 image files (no data: prefix, as Ollama's clients send)

    @model_validator(mode="after")
    def _calls_are_an_assistants(self):
        if (self.tool_calls or self.thinking) and self.role != "assistant":
            raise ValueError("only an assistant message carries tool_calls or thinking")
        return self

    def chat(self) -> dict:
        out = self.model_dump(exclude_none=True, exclude={"images", "tool_name"})
        if self.tool_name is not None:
            out["name"] = self.tool_name
        if self.images:
            out["content"] = [{"type": "image", "image": i} for i in self.images] + \
                ([{"type": "text", "text": self.content}] if self.content else [])
        return out


class ChatBody(_Base):
    messages: list[Message]  # none: only load the model (or unload it, with keep_alive 0)
    tools: Optional[list[dict[str, Any]]] = None


class GenerateBody(_Base):
    # a raw prompt takes no system prompt and no think level (they are the template's)
    model_config = ConfigDict(extra="forbid", strict=True, json_schema_extra={
        "if": {"required": ["raw"], "properties": {"raw": {"const": True}}},
        "then": {"properties": {"system": {"anyOf": [{"type": "null"}, {"const": ""}]},
                                "think": {"not": {"type": "string"}},
                                "images": {"anyOf": [{"type": "null"}, {"type": "array", "maxItems": 0}]}}}})
    prompt: str = ""
    system: Optional[str] = None
    raw: bool = False
    images: Optional[list[str]] = None  # base64 image files, before the prompt in its user turn


class EmbedBody(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    model: ModelId
    input: Union[Annotated[str, Field(min_length=1)], Annotated[list[Annotated[str, Field(min_length=1)]],
                                                                Field(min_length=1)]]
    truncate: Annotated[Optional[bool], WithJsonSchema({"enum": [False, None]})] = None  # long inputs are refused
    dimensions: Annotated[Optional[Int], Unsupported] = None
    options: Annotated[Optional[dict[str, Any]], WithJsonSchema({"type": ["object", "null"], "maxProperties": 0})] = None
    keep_alive: Optional[Union[float, str]] = None


class ShowBody(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)  # the client also sends `verbose`, which changes nothing here
    model: ModelId


NEVER = "9999-12-31T23:59:59+00:00"  # /api/ps's expires_at: loaded until unloaded


def _expires(engine, model: str) -> str:
    at = engine.lifecycle.expires(model, time.monotonic())
    if at is None:
        return NEVER
    return datetime.fromtimestamp(time.time() + (at - time.monotonic()), timezone.utc).isoformat()


def _now() -> str:
    return datetime.now(timezone.utc).isoformat()


def _kwargs(body: _Base) -> dict:
    """The engine keywords for an Ollama request (400 for what cannot be honoured)."""
    opts = body.options.model_dump(exclude_none=True) if body.options else {}
    stop, grammar = opts.pop("stop", None), opts.pop("grammar", None)
    kw = {OPTIONS[k]: v for k, v in opts.items()}
    if grammar is not None:
        kw["grammar"] = grammar
    if kw.get("top_k") == 0:  # Ollama's (and llama.cpp's) top_k 0: the whole vocabulary
        kw["top_k"] = None
    if kw.get("max_tokens", 1) < 0:  # Ollama's num_predict -1: until the context is full
        kw.pop("max_tokens")
    kw["stop"] = stop
    if body.format == "json":
        kw["response_format"] = {"type": "json_object"}
    elif isinstance(body.format, dict):
        kw["response_format"] = {"type": "json_schema", "json_schema": {"name": "ollama", "schema": body.format}}
    elif body.format not in (None, ""):
        raise InvalidRequest('format must be "json" or a JSON schema', "format")
    if body.think is not None:
        kw["think"] = "separate" if body.think else "strip"
    if isinstance(body.think, str):
        kw["reasoning_effort"] = body.think  # a template with no reasoning switch renders as with think: true
    return kw


def _tail(out, started: float) -> dict:
    t = out.timings
    ttft = (t.get("ttft_ms") or 0.0) * 1e6
    return {"done": True, "done_reason": "length" if out.finish_reason == "length" else "stop",
            "total_duration": int((time.monotonic() - started) * 1e9), "load_duration": 0,
            "prompt_eval_count": out.prompt_tokens, "prompt_eval_duration": int(ttft),
            "eval_count": out.completion_tokens, "eval_duration": int((t.get("predicted_ms") or 0.0) * 1e6)}


def _arguments(text: str):
    """A call's arguments as Ollama sends them (an object), or the model's text when it wrote
    no JSON object (a harmony call is passed on as written)."""
    try:
        obj = json.loads(text)
    except json.JSONDecodeError:
        return text
    return obj if isinstance(obj, dict) else text


def _message(out, think, streamed: bool = False) -> dict:
    """The answer's message; its thinking when asked for (or separated anyway: harmony), unless
    it was streamed already."""
    msg: dict[str, Any] = {"role": "assistant", "content": out.text}
    if (think or (think is None and out.reasoning)) and not streamed:
        msg["thinking"] = out.reasoning
    if out.tool_calls:
        msg["tool_calls"] = [{"function": {"name": c.name, "arguments": _arguments(c.arguments)}}
                             for c in out.tool_calls]
    return msg


def router(engine) -> APIRouter:
    api = APIRouter()

    @api.get("/api/version")
    async def version():
        return {"version": __version__}

    @api.get("/api/tags")
    async def tags():
        return {"models": [_card(m) for m in engine.registry.list()]}

    @api.get("/api/ps")
    async def ps():
        """The models loaded now, and when each unloads if nothing uses it (its keep-alive)."""
        loaded = {}
        for (model_id, _), session in engine.sessions.sessions():
            loaded.setdefault(model_id, session)
        return {"models": [{**_card(s.manifest), "expires_at": _expires(engine, m), "size_vram": 0,
                            "context_length": s.plan.n_ctx} for m, s in loaded.items()]}

    @api.post("/api/show")
    async def show(body: ShowBody):
        m = engine.registry.get(body.model)
        arch = m.architecture or ""
        return {"modelfile": "", "parameters": "", "template": m.chat_template or "", "details": _details(m),
                "model_info": {"general.architecture": arch, f"{arch}.context_length": m.context_length},
                "capabilities": ["embedding" if m.kind == "embedding" else "completion"]
                + (["vision"] if m.mmproj else []), "modified_at": _now()}

    @api.post("/api/embed")
    async def embed(body: EmbedBody):
        for name in ("dimensions", "options"):
            if getattr(body, name) not in (None, {}):
                raise InvalidRequest(f"{name} is not supported by rase's /api/embed", name)
        if body.truncate:
            raise InvalidRequest("truncate is not supported: an input longer than the context is refused",
                                 "truncate")
        engine.registry.get(body.model)
        _keep(engine, body)
        started = time.monotonic()
        vectors, n_tokens = await run_in_threadpool(engine.embed, body.model, body.input)
        return {"model": body.model, "embeddings": [v.tolist() for v in vectors],
                "total_duration": int((time.monotonic() - started) * 1e9), "load_duration": 0,
                "prompt_eval_count": n_tokens}

    @api.post("/api/chat")
    async def chat(body: ChatBody):
        if not body.messages:
            return await _load_only(engine, body, {"message": {"role": "assistant", "content": ""}})
        kw = _kwargs(body)
        if body.tools:
            kw["tools"] = body.tools
        messages = [m.chat() for m in body.messages]
        submit = lambda: engine.submit_chat(body.model, messages, **kw)
        return await _answer(engine, body, submit, chat=True)

    @api.post("/api/generate")
    async def generate(body: GenerateBody):
        if not body.prompt and not body.system:
            return await _load_only(engine, body, {"response": ""})
        kw = _kwargs(body)
        if body.raw:
            if body.system:
                raise InvalidRequest("system does not apply to a raw prompt", "system")
            if isinstance(body.think, str):
                raise InvalidRequest("a think level applies to the chat template, not to a raw prompt", "think")
            if body.images:  # the OpenAPI document says so too (raw: no images)
                raise InvalidRequest("images go into the chat template's user turn: send them without raw", "images")
            submit = lambda: engine.submit_complete(body.model, body.prompt, **{k: v for k, v in kw.items()
                                                                                if k != "think"})
        else:  # the model's chat template, as Ollama applies it
            user = Message(role="user", content=body.prompt, images=body.images).chat()
            messages = ([{"role": "system", "content": body.system}] if body.system else []) + [user]
            submit = lambda: engine.submit_chat(body.model, messages, **kw)
        return await _answer(engine, body, submit, chat=False)

    return api


def _keep(engine, body) -> None:
    """The request's keep_alive, for its model (absent: as the model has it)."""
    if body.keep_alive is not None:
        engine.lifecycle.keep(body.model, parse_duration(body.keep_alive))


async def _load_only(engine, body: _Base, part: dict):
    """Ollama's load (an empty prompt) and unload (that and keep_alive 0): done_reason says which."""
    engine.registry.get(body.model)
    kw = _kwargs(body)  # what the request says is checked even though nothing is generated
    engine.check_generation(**{k: v for k, v in kw.items() if k in GEN_FIELDS})
    started = time.monotonic()
    seconds = False if body.keep_alive is None else parse_duration(body.keep_alive)  # False: as it was
    if seconds is not False and seconds == 0:
        await run_in_threadpool(engine.unload, body.model)
        reason = "unload"
    else:
        await run_in_threadpool(engine.load, body.model, seconds)
        reason = "load"
    line = {"model": body.model, "created_at": _now(), **part, "done": True, "done_reason": reason,
            "total_duration": int((time.monotonic() - started) * 1e9)}
    if not body.stream:
        return line
    return StreamingResponse(iter([json.dumps(line) + "\n"]), media_type="application/x-ndjson")


async def _answer(engine, body: _Base, submit, chat: bool):
    engine.registry.get(body.model)  # 404 first
    _keep(engine, body)
    started = time.monotonic()
    handle = await run_in_threadpool(submit)
    head = {"model": body.model}
    if not body.stream:
        out = await handle.aresult()
        part = {"message": _message(out, body.think)} if chat else {"response": out.text}
        return {**head, "created_at": _now(), **part, **_tail(out, started)}

    async def lines():
        try:
            async for out in handle.aoutputs():  # tool calls come whole in the last line; no logprobs here
                for part in _parts(out, chat, body.think is not False):
                    yield json.dumps({**head, "created_at": _now(), **part, "done": False}) + "\n"
            out = await handle.aresult()
            last = {"message": {**_message(out, body.think, streamed=True), "content": ""}} if chat else {"response": ""}
            yield json.dumps({**head, "created_at": _now(), **last, **_tail(out, started)}) + "\n"
        except RaseError as exc:
            yield json.dumps({"error": str(exc), "status": status_of(exc)[0]}) + "\n"
        finally:
            handle.cancel()

    return StreamingResponse(lines(), media_type="application/x-ndjson")


def _parts(out, chat: bool, thinking: bool) -> list[dict]:
    """One output.Output as the message parts of streamed lines: its thinking (when shown), its text."""
    parts = []
    if out.reasoning and thinking:
        parts.append({"message": {"role": "assistant", "content": "", "thinking": out.reasoning}} if chat
                     else {"response": "", "thinking": out.reasoning})
    if out.text:
        parts.append({"message": {"role": "assistant", "content": out.text}} if chat else {"response": out.text})
    return parts


def _details(m) -> dict:
    arch = m.architecture or ""
    return {"format": "gguf", "family": arch, "families": [arch] if arch else [], "parameter_size": "",
            "quantization_level": ""}


def _card(m) -> dict:
    import os

    try:
        size = os.path.getsize(m.weights)
    except OSError:
        size = 0
    return {"name": m.id, "model": m.id, "modified_at": _now(), "size": size, "digest": m.sha256 or "",
            "details": _details(m)}
