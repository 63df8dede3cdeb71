"""Anthropic's Messages API over the chat engine: POST /v1/messages (whole, or streamed as
message_start / content_block_* / message_delta / message_stop events) and POST
/v1/messages/count_tokens. The guard takes the key from `x-api-key` as well as `Authorization`.

A request becomes chat messages (system, text / tool_use / tool_result / thinking blocks) and
one engine chat request; its Completion becomes content blocks: thinking, then text, then
tool_use.
"""
from __future__ import annotations

import json
import secrets
from typing import Annotated, Any, AsyncIterator, Literal, Optional, Union

from fastapi import APIRouter
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, model_validator
from starlette.concurrency import run_in_threadpool

from ..errors import InvalidRequest, RaseError
from .errors import status_of
from .schemas import Absent, FunctionName, Int, ModelId


class Tool(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    name: FunctionName
    description: Optional[str] = None
    input_schema: dict[str, Any]
    type: Optional[Literal["custom"]] = None
    cache_control: Optional[dict[str, Any]] = None  # rase caches every prompt prefix, marked or not


class ToolChoice(BaseModel):
    # a name with type "tool", and only there
    model_config = ConfigDict(extra="forbid", strict=True, json_schema_extra={
        "if": {"properties": {"type": {"const": "tool"}}},
        "then": {"required": ["name"], "properties": {"name": {"type": "string"}}},
        "else": {"properties": {"name": {"type": "null"}}}})
    type: Literal["auto", "any", "tool", "none"]
    name: Optional[str] = None
    disable_parallel_tool_use: Optional[bool] = None


class Thinking(BaseModel):
    """enabled: reason within budget_tokens; adaptive: as the model decides (no budget);
    disabled: no reasoning. display omitted: thinking blocks come empty."""
    model_config = ConfigDict(extra="forbid", strict=True, json_schema_extra={"allOf": [
        {"if": {"properties": {"type": {"const": "enabled"}}},
         "then": {"required": ["budget_tokens"], "properties": {"budget_tokens": {"type": "integer"}}},
         "else": {"properties": {"budget_tokens": {"type": "null"}}}}]})
    type: Literal["enabled", "adaptive", "disabled"]
    budget_tokens: Optional[Int] = Field(default=None, ge=0)
    display: Optional[Literal["summarized", "omitted"]] = None  # summarized: rase gives the reasoning whole

    @model_validator(mode="after")
    def _budget_with_enabled(self):
        if (self.type == "enabled") != (self.budget_tokens is not None):
            raise ValueError('budget_tokens goes with type "enabled" (and only with it)')
        return self


class OutputFormat(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    type: Literal["json_schema"]
    schema_: dict[str, Any] = Field(alias="schema")


class OutputConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    effort: Optional[Literal["low", "medium", "high", "xhigh", "max"]] = None  # the template's reasoning effort
    format: Optional[OutputFormat] = None


class Metadata(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    user_id: Optional[str] = None  # the caller's end user: accepted, recorded nowhere


class _Block(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    cache_control: Optional[dict[str, Any]] = None  # rase caches every prompt prefix, marked or not


class TextBlock(_Block):
    type: Literal["text"]
    text: str
    citations: Annotated[Optional[list[Any]], Field(max_length=0)] = None


class ToolUseBlock(_Block):
    type: Literal["tool_use"]
    id: str
    name: str
    input: dict[str, Any]


class ToolResultBlock(_Block):
    type: Literal["tool_result"]
    tool_use_id: str
    content: Union[str, list[TextBlock]] = ""
    is_error: Optional[bool] = None


class ThinkingBlock(_Block):
    type: Literal["thinking"]
    thinking: str
    signature: Optional[str] = None  # rase signs nothing; an echoed signature is taken as it is




class Base64Source(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    type: Literal["base64"]
    media_type: Literal["image/jpeg", "image/png", "image/gif", "image/webp"]
    data: str


class UrlSource(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    type: Literal["url"]
    url: str  # refused with a 400 when read: rase fetches no URL


class ImageBlock(_Block):
    type: Literal["image"]
    source: Annotated[Union[Base64Source, UrlSource], Field(discriminator="type")]


UserBlock = Annotated[Union[TextBlock, ImageBlock, ToolResultBlock], Field(discriminator="type")]
AssistantBlock = Annotated[Union[TextBlock, ToolUseBlock, ThinkingBlock], Field(discriminator="type")]


class UserMessage(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    role: Literal["user"]
    content: Union[str, Annotated[list[UserBlock], Field(min_length=1)]]


class AssistantMessage(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    role: Literal["assistant"]
    content: Union[str, Annotated[list[AssistantBlock], Field(min_length=1)]]


Message = Annotated[Union[UserMessage, AssistantMessage], Field(discriminator="role")]


class _Base(BaseModel):
    # a tool_choice other than {"type": "none"} needs tools; tools and an output format exclude each other
    model_config = ConfigDict(extra="forbid", strict=True, json_schema_extra={"allOf": [{
        "if": {"required": ["tool_choice"], "properties": {"tool_choice": {
            "type": "object", "properties": {"type": {"not": {"const": "none"}}}}}},
        "then": {"required": ["tools"], "properties": {"tools": {"type": "array", "minItems": 1}}}}, {
        "not": {"required": ["tools", "output_config"], "properties": {
            "tools": {"type": "array", "minItems": 1},
            "output_config": {"type": "object", "required": ["format"],
                              "properties": {"format": {"not": {"type": "null"}}}}}}}]})
    model: ModelId
    messages: Annotated[list[Message], Field(min_length=1)]
    system: Optional[Union[str, list[TextBlock]]] = None
    tools: Optional[list[Tool]] = None
    tool_choice: Optional[ToolChoice] = None
    thinking: Optional[Thinking] = None
    output_config: Optional[OutputConfig] = None
    cache_control: Optional[dict[str, Any]] = None  # rase caches every prompt prefix, marked or not


class MessagesRequest(_Base):
    max_tokens: Int = Field(ge=1)
    stop_sequences: Optional[list[Annotated[str, Field(min_length=1)]]] = None
    # sampling, as older clients send it (the 2026 SDK has none: pass them in extra_body)
    temperature: Optional[float] = Field(default=None, ge=0.0, le=1.0)
    top_p: Optional[float] = Field(default=None, gt=0.0, le=1.0)
    top_k: Optional[Int] = Field(default=None, ge=1)
    stream: bool = False
    metadata: Optional[Metadata] = None
    seed: Optional[Int] = Field(default=None, ge=0)  # extension, as on /v1/chat/completions
    service_tier: Absent = None


class CountTokensRequest(_Base):
    pass


def _text(content, where: str) -> str:
    """A string, or text blocks joined."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list) or not all(isinstance(b, dict) and b.get("type") == "text"
                                                and isinstance(b.get("text"), str) for b in content):
        raise InvalidRequest(f"{where}: only text blocks are supported here", where)
    return "".join(b["text"] for b in content)


def _assistant(blocks: list, where: str) -> dict:
    msg: dict[str, Any] = {"role": "assistant", "content": ""}
    for j, b in enumerate(blocks):
        kind = b.get("type") if isinstance(b, dict) else None
        if kind == "text" and isinstance(b.get("text"), str):
            msg["content"] += b["text"]
        elif kind == "thinking" and isinstance(b.get("thinking"), str):
            msg["reasoning_content"] = b["thinking"]
        elif kind == "tool_use" and isinstance(b.get("id"), str) and isinstance(b.get("name"), str) \
                and isinstance(b.get("input"), dict):
            msg.setdefault("tool_calls", []).append({"id": b["id"], "type": "function", "function": {
                "name": b["name"], "arguments": json.dumps(b["input"], ensure_ascii=False)}})
        else:
            raise InvalidRequest(f"{where}.content[{j}]: an assistant turn takes text, thinking and tool_use blocks",
                                 f"{where}.content")
    if msg.get("tool_calls") and not msg["content"]:
        msg["content"] = None
    return msg


def _user(blocks: list, where: str) -> list[dict]:
    """Tool results (as tool messages, first), then the user's text and images (parts)."""
    results, text, parts = [], [], []
    for j, b in enumerate(blocks):
        kind = b.get("type") if isinstance(b, dict) else None
        if kind == "text" and isinstance(b.get("text"), str):
            text.append(b["text"])
            parts.append(b)
        elif kind == "image" and isinstance(b.get("source"), dict):
            src = b["source"]
            url = f"data:{src['media_type']};base64,{src['data']}" if src.get("type") == "base64" else src.get("url")
            parts.append({"type": "image", "image": url})
        elif kind == "tool_result" and isinstance(b.get("tool_use_id"), str):
            out = _text(b.get("content", ""), f"{where}.content[{j}].content")
            results.append({"role": "tool", "tool_call_id": b["tool_use_id"],
                            "content": f"Error: {out}" if b.get("is_error") else out})
        else:
            raise InvalidRequest(f"{where}.content[{j}]: a user turn takes text, image and tool_result blocks "
                                 f"(not {kind!r})", f"{where}.content")
    if len(parts) > len(text):  # images: the parts in order, joined as llama-server joins them
        return results + [{"role": "user", "content": [{"type": p["type"], p["type"]: p.get("text", p.get("image"))}
                                                       for p in parts]}]
    return results + ([{"role": "user", "content": "".join(text)}] if text else [])


def chat_messages(req: _Base) -> list[dict]:
    system = req.system if isinstance(req.system, str) or req.system is None else \
        [b.model_dump(exclude_none=True) for b in req.system]
    out = [{"role": "system", "content": _text(system, "system")}] if system else []
    for i, m in enumerate(req.messages):
        where = f"messages[{i}]"
        blocks = [{"type": "text", "text": m.content}] if isinstance(m.content, str) else \
            [b.model_dump(exclude_none=True) for b in m.content]
        if m.role == "assistant":
            out.append(_assistant(blocks, where))
        else:
            out += _user(blocks, where)
    return out


def _tools(req: _Base) -> dict:
    tools = [{"type": "function", "function": {"name": t.name, "parameters": t.input_schema,
                                               **({"description": t.description} if t.description else {})}}
             for t in req.tools or []]
    c, choice, parallel = req.tool_choice, None, None
    if c is not None:
        if (c.type == "tool") != (c.name is not None):
            raise InvalidRequest('tool_choice: a name goes with type "tool" only', "tool_choice")
        choice = {"auto": "auto", "any": "required", "none": "none"}.get(c.type) or \
            {"type": "function", "function": {"name": c.name}}
        parallel = None if c.disable_parallel_tool_use is None else not c.disable_parallel_tool_use
    return {"tools": tools or None, "tool_choice": choice, "parallel_tool_calls": parallel}


def _budget(req: _Base) -> int | None:
    """thinking enabled: its budget; disabled: a block closes at once; adaptive or absent: the engine's."""
    t = req.thinking
    if t is None or t.type == "adaptive":
        return None
    return 0 if t.type == "disabled" else t.budget_tokens


EFFORTS = {"low": "low", "medium": "medium", "high": "high", "xhigh": "high", "max": "high"}


def _output(req: _Base) -> dict:
    """output_config: a JSON schema format, and the effort as the template's reasoning effort."""
    c = req.output_config
    if c is None:
        return {}
    out: dict[str, Any] = {}
    if c.format is not None:
        out["response_format"] = {"type": "json_schema", "json_schema": {"name": "output", "schema": c.format.schema_}}
    if c.effort is not None:
        out["reasoning_effort"] = EFFORTS[c.effort]
    return out


# ---------------------------------------------------------------- output

def _input(arguments: str) -> dict:
    try:
        obj = json.loads(arguments)
    except json.JSONDecodeError:
        obj = None
    return obj if isinstance(obj, dict) else {"arguments": arguments}


def _blocks(out, shown: bool = True) -> list[dict]:
    """shown False: thinking display omitted (the blocks come empty)."""
    blocks = [{"type": "thinking", "thinking": out.reasoning if shown else "", "signature": ""}] if out.reasoning else []
    if out.text or not out.tool_calls:
        blocks.append({"type": "text", "text": out.text})
    blocks += [{"type": "tool_use", "id": c.id, "name": c.name, "input": _input(c.arguments)} for c in out.tool_calls]
    return blocks


def _stop(out) -> tuple[str, str | None]:
    if out.tool_calls:
        return "tool_use", None
    if out.finish_reason == "length":
        return "max_tokens", None
    return ("stop_sequence", out.stop_sequence) if out.stop_sequence else ("end_turn", None)


def _usage(out) -> dict:
    return {"input_tokens": out.prompt_tokens - out.cached_tokens, "output_tokens": out.completion_tokens,
            "cache_read_input_tokens": out.cached_tokens, "cache_creation_input_tokens": 0}


def router(engine, metrics) -> APIRouter:
    api = APIRouter()

    @api.post("/v1/messages")
    async def messages(req: MessagesRequest):
        engine.registry.get(req.model)  # 404 before anything else
        msgs = chat_messages(req)
        gen = dict(max_tokens=req.max_tokens, temperature=req.temperature, top_p=req.top_p, top_k=req.top_k,
                   seed=req.seed)
        kw = dict({k: v for k, v in gen.items() if v is not None}, stop=req.stop_sequences, **_tools(req),
                  **_output(req), think="separate", reasoning_budget=_budget(req))
        shown = req.thinking is None or req.thinking.display != "omitted"
        handle = await run_in_threadpool(lambda: engine.submit_chat(req.model, msgs, **kw))
        mid = f"msg_{secrets.token_hex(12)}"
        if not req.stream:
            try:
                out = await handle.aresult()
            finally:
                handle.cancel()
            metrics.finished(req.model, [out])
            reason, sequence = _stop(out)
            return {"id": mid, "type": "message", "role": "assistant", "model": req.model, "content": _blocks(out, shown),
                    "stop_reason": reason, "stop_sequence": sequence, "usage": _usage(out)}
        return StreamingResponse(_events(handle, mid, req.model, shown, lambda out: metrics.finished(req.model, [out])),
                                 media_type="text/event-stream")

    @api.post("/v1/messages/count_tokens")
    async def count_tokens(req: CountTokensRequest):
        engine.registry.get(req.model)
        msgs = chat_messages(req)
        effort = _output(req).get("reasoning_effort")
        n = await run_in_threadpool(lambda: engine.chat_prompt_tokens(req.model, msgs, **_tools(req),
                                                                      reasoning_effort=effort))
        return {"input_tokens": n}

    return api


def _sse(kind: str, **body) -> str:
    return f"event: {kind}\ndata: {json.dumps({'type': kind, **body})}\n\n"


class _Blocks:
    """Content blocks of a streamed message: thinking and text open as their first delta
    arrives and close before the next block; each tool_use comes whole."""

    def __init__(self) -> None:
        self.count, self.open = 0, None  # the open block's kind

    def delta(self, kind: str, text: str) -> list[str]:
        out = []
        if self.open != kind:
            out += self.close()
            start = {"type": "thinking", "thinking": "", "signature": ""} if kind == "thinking" else \
                {"type": "text", "text": ""}
            out.append(_sse("content_block_start", index=self.count, content_block=start))
            self.open = kind
        if text:
            delta = {"type": "thinking_delta", "thinking": text} if kind == "thinking" else \
                {"type": "text_delta", "text": text}
            out.append(_sse("content_block_delta", index=self.count, delta=delta))
        return out

    def close(self) -> list[str]:
        if self.open is None:
            return []
        self.open, self.count = None, self.count + 1
        return [_sse("content_block_stop", index=self.count - 1)]

    def output(self, out, shown: bool) -> list[str]:
        """One output.Output: its thinking (empty unless shown), its text, its tool calls."""
        parts = self.delta("thinking", out.reasoning if shown else "") if out.reasoning else []
        if out.text:
            parts += self.delta("text", out.text)
        for call in out.calls:
            parts += self.call(call)
        return parts

    def call(self, call) -> list[str]:
        out = self.close()
        start = {"type": "tool_use", "id": call.id, "name": call.name, "input": {}}
        out.append(_sse("content_block_start", index=self.count, content_block=start))
        out.append(_sse("content_block_delta", index=self.count,
                        delta={"type": "input_json_delta", "partial_json": json.dumps(_input(call.arguments))}))
        out.append(_sse("content_block_stop", index=self.count))
        self.count += 1
        return out


async def _events(handle, mid: str, model: str, shown: bool, on_done) -> AsyncIterator[str]:
    blocks, texts = _Blocks(), 0
    try:
        prompt = len(handle.request.prompt) if handle.request is not None else 0
        yield _sse("message_start", message={
            "id": mid, "type": "message", "role": "assistant", "model": model, "content": [], "stop_reason": None,
            "stop_sequence": None, "usage": {"input_tokens": prompt, "output_tokens": 0}})
        try:
            async for out in handle.aoutputs():
                for p in blocks.output(out, shown):
                    yield p
                texts += bool(out.text)
            out = await handle.aresult()
        except RaseError as exc:
            status, kind = status_of(exc)
            yield _sse("error", error={"type": kind, "message": str(exc)})
            return
        if not out.tool_calls and not texts:  # an empty answer is an empty text block
            for p in blocks.delta("text", ""):
                yield p
        for p in blocks.close():
            yield p
        on_done(out)
        reason, sequence = _stop(out)
        yield _sse("message_delta", delta={"stop_reason": reason, "stop_sequence": sequence}, usage=_usage(out))
        yield _sse("message_stop")
    finally:
        handle.cancel()
