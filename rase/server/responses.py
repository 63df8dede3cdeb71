"""OpenAI's Responses API over the chat engine: POST /v1/responses (whole, or as the typed
server-sent events the openai SDK reassembles), GET /v1/responses/{id}, POST
/v1/responses/input_tokens.

A request becomes chat messages (instructions, input items, the stored conversation of
previous_response_id) and one engine chat request; its Completion becomes output items:
reasoning, then the message, then function calls. Responses are kept for previous_response_id
and GET in a bounded store that lives as long as the app (no module-level state).
"""
from __future__ import annotations

import json
import secrets
import threading
import time
from collections import OrderedDict
from typing import Annotated, Any, AsyncIterator, Literal, Optional, Union

from fastapi import APIRouter
from fastapi import Path as FastAPIPath
from fastapi.responses import StreamingResponse
from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, WithJsonSchema
from starlette.concurrency import run_in_threadpool

from ..errors import InvalidRequest, RaseError, ResponseNotFound
from .errors import status_of
from .schemas import Absent, FunctionName, Int, ModelId, needs

STORED = 256  # responses kept for previous_response_id and GET (least recently used dropped)
EFFORT = Literal["none", "minimal", "low", "medium", "high"]


def _bool(value):
    if not isinstance(value, bool):
        raise ValueError("must be a boolean")
    return value


class _Item(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class TextPart(_Item):
    type: Literal["input_text", "output_text"]
    text: str
    annotations: Optional[list[Any]] = None  # echoed back from an output message
    logprobs: Optional[list[Any]] = None


class ImagePart(_Item):
    type: Literal["input_image"]
    image_url: str = Field(description="data:image/...;base64,... (URLs are not fetched)")
    detail: Optional[Literal["auto", "high"]] = None  # every image is read at the encoder's full resolution
    file_id: Absent = None                             # rase keeps no files


class MessageItem(_Item):
    type: Literal["message"] = "message"
    role: Literal["user", "system", "developer", "assistant"]
    content: Union[str, list[Annotated[Union[TextPart, ImagePart], Field(discriminator="type")]]]
    id: Optional[str] = None
    status: Optional[str] = None


class FunctionCallItem(_Item):
    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str
    id: Optional[str] = None
    status: Optional[str] = None


class FunctionCallOutputItem(_Item):
    type: Literal["function_call_output"]
    call_id: str
    output: Union[str, list[TextPart]]
    id: Optional[str] = None
    status: Optional[str] = None


class ReasoningPart(_Item):
    type: Literal["reasoning_text", "summary_text"]
    text: str


class ReasoningItem(_Item):
    type: Literal["reasoning"]
    summary: list[ReasoningPart] = []
    content: Optional[list[ReasoningPart]] = None
    id: Optional[str] = None
    status: Optional[str] = None


InputItem = Union[MessageItem, FunctionCallItem, FunctionCallOutputItem, ReasoningItem]


def _not_only_reasoning(items: list) -> list:
    if all(isinstance(i, ReasoningItem) for i in items):
        raise ValueError("input needs an item besides reasoning (a message, a function call or its output)")
    return items
# a list holds at least one item besides reasoning (a conversation of reasoning alone is empty)
Input = Union[Annotated[str, Field(min_length=1)],
              Annotated[list[InputItem], Field(min_length=1), WithJsonSchema({
                  "type": "array", "items": {"anyOf": [{"$ref": f"#/components/schemas/{m.__name__}"} for m in
                                                       (MessageItem, FunctionCallItem, FunctionCallOutputItem,
                                                        ReasoningItem)]},
                  "minItems": 1, "contains": {"not": {"$ref": "#/components/schemas/ReasoningItem"}}}),
                  AfterValidator(_not_only_reasoning)]]


class FunctionTool(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    type: Literal["function"]
    name: FunctionName
    description: Optional[str] = None
    parameters: Optional[dict[str, Any]] = None
    strict: Optional[bool] = None


class PlainFormat(_Item):
    type: Literal["text", "json_object"]


class SchemaFormat(_Item):
    type: Literal["json_schema"]
    name: Annotated[str, Field(pattern=r"^[a-zA-Z0-9_-]{1,64}$")]
    schema_: dict[str, Any] = Field(alias="schema")
    strict: Optional[bool] = None
    description: Optional[str] = None


class FunctionChoice(_Item):
    type: Literal["function"]
    name: str


Choice = Optional[Union[Literal["auto", "none", "required"], FunctionChoice]]


class TextConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    format: Optional[Annotated[Union[PlainFormat, SchemaFormat], Field(discriminator="type")]] = None
    verbosity: Absent = None


class ReasoningConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    effort: Optional[EFFORT] = None
    # the reasoning comes whole as reasoning_text content; no summary is written
    summary: Optional[Literal["auto", "concise", "detailed"]] = None


# function tools and a JSON text format exclude each other
_TOOLS_OR_FORMAT = {"not": {"required": ["tools", "text"], "properties": {
    "tools": {"type": "array", "minItems": 1},
    "text": {"type": "object", "required": ["format"], "properties": {"format": {
        "type": "object", "properties": {"type": {"enum": ["json_object", "json_schema"]}}}}}}}}


class _Prompt(BaseModel):
    """What makes a response's prompt (all /v1/responses/input_tokens takes)."""
    model_config = ConfigDict(extra="forbid", strict=True, json_schema_extra={"allOf": [
        needs("tool_choice", "tools", "none"), _TOOLS_OR_FORMAT]})
    model: ModelId
    input: Input
    instructions: Optional[str] = None
    previous_response_id: Optional[str] = None
    tools: Optional[list[FunctionTool]] = None
    tool_choice: Choice = None
    parallel_tool_calls: Optional[bool] = None
    text: Optional[TextConfig] = None
    reasoning: Optional[ReasoningConfig] = None
    truncation: Optional[Literal["disabled"]] = None  # an input over the context is refused, never cut
    chat_template_kwargs: Optional[dict[str, Any]] = None  # extension (llama-server's)


class InputTokensRequest(_Prompt):
    pass


class ResponsesRequest(_Prompt):
    """The fields rase implements; any other is a 400 that names it."""
    max_output_tokens: Optional[Int] = Field(default=None, ge=1)
    temperature: Optional[float] = Field(default=None, ge=0.0, le=2.0)
    top_p: Optional[float] = Field(default=None, gt=0.0, le=1.0)
    stream: bool = False
    store: bool = True
    metadata: Optional[dict[str, str]] = None
    user: Optional[str] = None
    safety_identifier: Optional[str] = None
    prompt_cache_key: Optional[str] = None  # rase reuses any cached prefix without a key
    seed: Optional[Int] = Field(default=None, ge=0)    # extension, as on /v1/chat/completions
    top_k: Optional[Int] = Field(default=None, ge=1)   # extension
    include: Annotated[Optional[list[str]], Field(max_length=0)] = None
    background: Optional[Annotated[Literal[False], BeforeValidator(_bool)]] = None


class _Store:
    """response id -> (the response object, the conversation it ends: messages without instructions)."""

    def __init__(self, size: int = STORED) -> None:
        self._items: OrderedDict[str, tuple[dict, list[dict]]] = OrderedDict()
        self._lock = threading.Lock()
        self.size = size

    def put(self, rid: str, response: dict, messages: list[dict]) -> None:
        with self._lock:
            self._items[rid] = (response, messages)
            self._items.move_to_end(rid)
            while len(self._items) > self.size:
                self._items.popitem(last=False)

    def get(self, rid: str, param: str = "previous_response_id") -> tuple[dict, list[dict]]:
        with self._lock:
            if rid not in self._items:
                raise ResponseNotFound(f"no response {rid!r}: responses are kept in memory for this server's "
                                       f"lifetime (the last {self.size}); send the whole input instead", param)
            self._items.move_to_end(rid)
            return self._items[rid]


def _text_of(content):
    """A message's text, or its parts in order when it holds images (joined by the engine)."""
    if isinstance(content, str):
        return content
    if any(isinstance(part, ImagePart) for part in content):
        return [{"type": "image", "image": p.image_url} if isinstance(p, ImagePart) else {"type": "text", "text": p.text}
                for p in content]
    return "".join(part.text for part in content)


def _item_messages(items: list) -> list[dict]:
    """Input items -> chat messages; consecutive function calls join the assistant turn before them."""
    out: list[dict] = []
    reasoning = None  # a reasoning item's text, for the assistant turn that follows it
    for item in items:
        if isinstance(item, MessageItem):
            msg = {"role": item.role, "content": _text_of(item.content)}
            if item.role == "assistant" and reasoning:
                msg["reasoning_content"], reasoning = reasoning, None
            out.append(msg)
        elif isinstance(item, FunctionCallItem):
            call = {"id": item.call_id, "type": "function", "function": {"name": item.name, "arguments": item.arguments}}
            last = out[-1] if out else None
            if last is None or last["role"] != "assistant":
                last = {"role": "assistant", "content": None}
                if reasoning:
                    last["reasoning_content"], reasoning = reasoning, None
                out.append(last)
            last.setdefault("tool_calls", []).append(call)
        elif isinstance(item, FunctionCallOutputItem):
            out.append({"role": "tool", "tool_call_id": item.call_id, "content": _text_of(item.output)})
        else:
            reasoning = "".join(p.text for p in (item.content or []) + item.summary) or None
    return out


def conversation(req, store: _Store) -> list[dict]:
    """The request's conversation (the previous response's, then its input), without instructions."""
    history = list(store.get(req.previous_response_id)[1]) if req.previous_response_id else []
    turn = [{"role": "user", "content": req.input}] if isinstance(req.input, str) else _item_messages(req.input)
    return history + turn


def _with_instructions(req, messages: list[dict]) -> list[dict]:
    return ([{"role": "system", "content": req.instructions}] if req.instructions else []) + messages


def _response_format(text: TextConfig | None) -> dict | None:
    fmt = text.format if text is not None else None
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return {"type": "json_object"}
    return {"type": "json_schema", "json_schema": fmt.model_dump(by_alias=True, exclude_none=True, exclude={"type"})}


def _tools(req) -> dict:
    """tools / tool_choice in chat completions' shape."""
    tools = [{"type": "function", "function": t.model_dump(exclude_none=True, exclude={"type"})} for t in req.tools or []]
    choice = req.tool_choice
    if isinstance(choice, FunctionChoice):
        choice = {"type": "function", "function": {"name": choice.name}}
    return {"tools": tools or None, "tool_choice": choice, "parallel_tool_calls": req.parallel_tool_calls}


def _template(req) -> dict:
    effort = req.reasoning.effort if req.reasoning is not None else None
    return {"reasoning_effort": effort, "chat_template_kwargs": req.chat_template_kwargs}


# ---------------------------------------------------------------- output

def _id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(16)}"


def _message_item(mid: str, text: str, status: str = "completed") -> dict:
    return {"type": "message", "id": mid, "status": status, "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]}


def _reasoning_item(rid: str, text: str) -> dict:
    return {"type": "reasoning", "id": rid, "summary": [], "content": [{"type": "reasoning_text", "text": text}],
            "status": "completed"}


def _call_item(fid: str, call, status: str = "completed") -> dict:
    return {"type": "function_call", "id": fid, "call_id": call.id, "name": call.name, "arguments": call.arguments,
            "status": status}


def _items(out, ids: dict) -> list[dict]:
    """reasoning, the message (unless the answer is calls only), the calls; ids by kind (kept
    from the stream)."""
    items = [_reasoning_item(ids.setdefault("reasoning", _id("rs")), out.reasoning)] if out.reasoning else []
    if out.text or not out.tool_calls:
        items.append(_message_item(ids.setdefault("message", _id("msg")), out.text))
    items += [_call_item(ids.setdefault(f"call{i}", _id("fc")), c) for i, c in enumerate(out.tool_calls)]
    return items


def _usage(out) -> dict:
    return {"input_tokens": out.prompt_tokens, "input_tokens_details": {"cached_tokens": out.cached_tokens},
            "output_tokens": out.completion_tokens,
            "output_tokens_details": {"reasoning_tokens": out.reasoning_tokens},
            "total_tokens": out.prompt_tokens + out.completion_tokens}


def _shell(req, rid: str, created: int, status: str = "in_progress") -> dict:
    """The response object without its output (what response.created carries)."""
    fmt = req.text.format.model_dump(by_alias=True, exclude_none=True) if req.text and req.text.format else {"type": "text"}
    return {"id": rid, "object": "response", "created_at": created, "status": status, "model": req.model,
            "output": [], "error": None, "incomplete_details": None, "instructions": req.instructions,
            "max_output_tokens": req.max_output_tokens, "previous_response_id": req.previous_response_id,
            "temperature": req.temperature, "top_p": req.top_p, "parallel_tool_calls": req.parallel_tool_calls is not False,
            "tool_choice": req.tool_choice.model_dump() if isinstance(req.tool_choice, FunctionChoice)
            else req.tool_choice or "auto",
            "tools": [t.model_dump(exclude_none=True) for t in req.tools or []], "text": {"format": fmt},
            "reasoning": {"effort": req.reasoning.effort if req.reasoning else None, "summary": None},
            "metadata": req.metadata or {}, "store": req.store, "truncation": "disabled", "usage": None,
            "user": req.user}


def _complete(shell: dict, out, ids: dict) -> dict:
    length = out.finish_reason == "length"
    return {**shell, "status": "incomplete" if length else "completed", "output": _items(out, ids),
            "incomplete_details": {"reason": "max_output_tokens"} if length else None, "usage": _usage(out)}


def _assistant_messages(response: dict) -> list[dict]:
    """The response's output as chat messages, for a later previous_response_id."""
    msg: dict[str, Any] = {"role": "assistant", "content": None}
    for item in response["output"]:
        if item["type"] == "reasoning":
            msg["reasoning_content"] = item["content"][0]["text"]
        elif item["type"] == "message":
            msg["content"] = item["content"][0]["text"]
        else:
            msg.setdefault("tool_calls", []).append({"id": item["call_id"], "type": "function",
                                                     "function": {"name": item["name"], "arguments": item["arguments"]}})
    if msg["content"] is None and "tool_calls" not in msg:
        msg["content"] = ""
    return [msg]


# ---------------------------------------------------------------- routes

def router(engine, metrics) -> APIRouter:
    api = APIRouter()
    store = _Store()

    @api.post("/v1/responses")
    async def create(req: ResponsesRequest):
        engine.registry.get(req.model)  # 404 before anything else
        messages = conversation(req, store)
        gen = dict(max_tokens=req.max_output_tokens, temperature=req.temperature, top_p=req.top_p, seed=req.seed,
                   top_k=req.top_k)
        kw = dict({k: v for k, v in gen.items() if v is not None}, response_format=_response_format(req.text),
                  **_tools(req), **_template(req), think="separate")
        handle = await run_in_threadpool(lambda: engine.submit_chat(req.model, _with_instructions(req, messages), **kw))
        shell = _shell(req, _id("resp"), int(time.time()))

        def finished(out, ids) -> dict:
            metrics.finished(req.model, [out])
            response = _complete(shell, out, ids)
            if req.store:
                store.put(shell["id"], response, messages + _assistant_messages(response))
            return response

        if not req.stream:
            try:
                return finished(await handle.aresult(), {})
            finally:
                handle.cancel()
        return StreamingResponse(_events(handle, shell, finished), media_type="text/event-stream")

    @api.post("/v1/responses/input_tokens")
    async def input_tokens(req: InputTokensRequest):
        engine.registry.get(req.model)
        messages = _with_instructions(req, conversation(req, store))
        if req.tools and _response_format(req.text) is not None:
            raise InvalidRequest("tools and a JSON text format cannot be combined", "tools")
        n = await run_in_threadpool(lambda: engine.chat_prompt_tokens(req.model, messages, **_tools(req),
                                                                      **_template(req)))
        return {"object": "response.input_tokens", "input_tokens": n}

    # the resp_ prefix in the route: /v1/responses/input_tokens is not a response id (GET there is a 405)
    @api.get("/v1/responses/resp_{key}")
    async def retrieve(key: Annotated[str, FastAPIPath(pattern=r"^[0-9a-f]+$", description="a response id after resp_")]):
        return store.get(f"resp_{key}", "response_id")[0]

    return api


class _Events:
    """The typed events of one streamed response, numbered; output items open as their first
    delta arrives (reasoning, then the message, then each call whole) and close before the next."""

    def __init__(self, shell: dict) -> None:
        self.shell, self.n, self.ids, self.count = shell, 0, {}, 0
        self.open: tuple[str, int, str] | None = None  # (kind, output index, text so far)

    def event(self, kind: str, **body) -> str:
        self.n += 1
        return f"event: {kind}\ndata: {json.dumps({'type': kind, 'sequence_number': self.n - 1, **body})}\n\n"

    def _begin(self, kind: str) -> list[str]:
        out = self.close()
        iid = self.ids.setdefault(kind, _id("rs" if kind == "reasoning" else "msg"))
        index, self.count = self.count, self.count + 1
        self.open = (kind, index, "")
        item = _reasoning_item(iid, "") if kind == "reasoning" else _message_item(iid, "", "in_progress")
        out.append(self.event("response.output_item.added", output_index=index, item={**item, "status": "in_progress"}))
        part = item["content"][0]
        out.append(self.event("response.content_part.added", item_id=iid, output_index=index, content_index=0,
                              part=part))
        return out

    def text(self, kind: str, delta: str) -> list[str]:
        out = self._begin(kind) if self.open is None or self.open[0] != kind else []
        _, index, text = self.open
        self.open = (kind, index, text + delta)
        name = "response.reasoning_text.delta" if kind == "reasoning" else "response.output_text.delta"
        extra = {} if kind == "reasoning" else {"logprobs": []}
        out.append(self.event(name, item_id=self.ids[kind], output_index=index, content_index=0, delta=delta, **extra))
        return out

    def close(self) -> list[str]:
        if self.open is None:
            return []
        kind, index, text = self.open
        self.open, iid = None, self.ids[kind]
        item = _reasoning_item(iid, text) if kind == "reasoning" else _message_item(iid, text)
        part = item["content"][0]
        done = "response.reasoning_text.done" if kind == "reasoning" else "response.output_text.done"
        extra = {} if kind == "reasoning" else {"logprobs": []}
        return [self.event(done, item_id=iid, output_index=index, content_index=0, text=text, **extra),
                self.event("response.content_part.done", item_id=iid, output_index=index, content_index=0, part=part),
                self.event("response.output_item.done", output_index=index, item=item)]

    def call(self, i: int, call) -> list[str]:
        out = self.close()
        fid = self.ids.setdefault(f"call{i}", _id("fc"))
        index, self.count = self.count, self.count + 1
        out.append(self.event("response.output_item.added", output_index=index,
                              item={**_call_item(fid, call, "in_progress"), "arguments": ""}))
        out.append(self.event("response.function_call_arguments.delta", item_id=fid, output_index=index,
                              delta=call.arguments))
        out.append(self.event("response.function_call_arguments.done", item_id=fid, output_index=index,
                              name=call.name, arguments=call.arguments))
        out.append(self.event("response.output_item.done", output_index=index, item=_call_item(fid, call)))
        return out


async def _events(handle, shell: dict, finished) -> AsyncIterator[str]:
    ev = _Events(shell)
    try:
        yield ev.event("response.created", response=shell)
        yield ev.event("response.in_progress", response=shell)
        try:
            async for out in handle.aoutputs():  # logprobs are not offered on this route
                parts = ev.text("reasoning", out.reasoning) if out.reasoning else []
                parts += ev.text("message", out.text) if out.text else []
                for call in out.calls:
                    parts += ev.call(call.index, call)
                for p in parts:
                    yield p
            out = await handle.aresult()
        except RaseError as exc:
            status, kind = status_of(exc)
            yield ev.event("error", code=kind, message=str(exc), param=getattr(exc, "param", None))
            yield ev.event("response.failed", response={**shell, "status": "failed",
                                                        "error": {"code": kind, "message": str(exc)}})
            return
        if not out.tool_calls and "message" not in ev.ids:  # an empty answer is an empty message
            for p in ev.text("message", ""):
                yield p
        for p in ev.close():
            yield p
        response = finished(out, ev.ids)
        yield ev.event("response.incomplete" if response["status"] == "incomplete" else "response.completed",
                       response=response)
    finally:
        handle.cancel()
