"""Tool calling: OpenAI's tools / tool_choice / parallel_tool_calls for a chat request.

ToolSpec is what a request asked for, validated before any generation (InvalidGrammar names
the field). Two formats, by the model's chat template:
- hermes (Qwen2.5/3, Hermes: the template uses `tools` and writes <tool_call>): tools rendered by
  the template itself; the model writes <tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>.
  `required` and a named tool are constrained from the first token; `auto` runs free until the
  model writes <tool_call>, then constrains the call (a lazy grammar).
- generic (every other template, as llama.cpp does): the tools go into a system message, and the
  answer is one JSON object, {"tool_call": {...}} or {"response": "..."}, constrained from token 0.
ToolText wraps a request's TextState: it streams content, holds the call text back, and turns
it into ToolCall deltas; calls() parses the final text.
"""
from __future__ import annotations

import json
import re
import secrets
from dataclasses import dataclass, field

from ..errors import InvalidGrammar
from .structured import JSON_OPTIONS, GrammarSpec, json_schema_grammar
from ..output import Output

_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
GENERIC_PROMPT = ("You can call these tools (JSON Schema of each tool's arguments):\n{tools}\n\n"
                  "Respond in JSON format, either with `tool_call` (a request to call tools) or with "
                  "`response` (your reply to the user's request).")


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    parameters: dict

    def openai(self) -> dict:
        return {"type": "function", "function": {"name": self.name, "description": self.description,
                                                 "parameters": self.parameters}}


@dataclass(frozen=True)
class ToolSpec:
    tools: tuple[Tool, ...]   # offered to the model (rendered)
    choice: str               # "auto" | "required" (a named tool: required with one tool callable)
    callable: tuple[str, ...]  # names the constraint allows
    parallel: bool

    @property
    def offered(self) -> list[dict]:
        return [t.openai() for t in self.tools]


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # JSON text of an object (what OpenAI sends)


@dataclass(frozen=True)
class ToolCallDelta:
    """One streamed call: index, id, name and the whole arguments text (the openai client
    concatenates arguments fragments per index)."""
    index: int
    id: str
    name: str
    arguments: str


def _tool(i: int, t) -> Tool:
    where = f"tools[{i}]"
    if not isinstance(t, dict) or t.get("type") != "function":
        raise InvalidGrammar("only function tools are supported (type: function)", f"{where}.type")
    unknown = sorted(set(t) - {"type", "function"})
    if unknown:
        raise InvalidGrammar(f"{where}: unknown field(s) {', '.join(unknown)}", where)
    f = t.get("function")
    if not isinstance(f, dict):
        raise InvalidGrammar(f"{where}.function must be an object with a name", f"{where}.function")
    unknown = sorted(set(f) - {"name", "description", "parameters", "strict"})
    if unknown:
        raise InvalidGrammar(f"{where}.function: unknown field(s) {', '.join(unknown)}", f"{where}.function")
    name = f.get("name")
    if not isinstance(name, str) or not _NAME.match(name):
        raise InvalidGrammar(f"{where}.function.name must match ^[a-zA-Z0-9_-]{{1,64}}$", f"{where}.function.name")
    params = f.get("parameters", {"type": "object"})
    if not isinstance(params, dict):
        raise InvalidGrammar(f"{where}.function.parameters must be a JSON schema object", f"{where}.function.parameters")
    desc = f.get("description", "")
    if not isinstance(desc, str):
        raise InvalidGrammar(f"{where}.function.description must be a string", f"{where}.function.description")
    return Tool(name, desc, params)


def tool_spec(tools=None, tool_choice=None, parallel_tool_calls=None) -> ToolSpec | None:
    """The request's tool fields, validated; None when no tool may be called (no tools, or
    tool_choice "none": then the tools are not rendered either)."""
    if tools is None or tools == []:
        if tool_choice not in (None, "none"):
            raise InvalidGrammar("tool_choice needs tools", "tool_choice")
        return None
    if not isinstance(tools, list):
        raise InvalidGrammar("tools must be a list of function tools", "tools")
    parsed = tuple(_tool(i, t) for i, t in enumerate(tools))
    names = [t.name for t in parsed]
    for i, n in enumerate(names):
        if n in names[:i]:
            raise InvalidGrammar(f"duplicate tool name {n}", f"tools[{i}].function.name")
    if parallel_tool_calls is not None and not isinstance(parallel_tool_calls, bool):
        raise InvalidGrammar("parallel_tool_calls must be a boolean", "parallel_tool_calls")
    parallel = True if parallel_tool_calls is None else parallel_tool_calls
    choice = "auto" if tool_choice is None else tool_choice
    if choice == "none":
        return None
    if choice in ("auto", "required"):
        return ToolSpec(parsed, choice, tuple(names), parallel)
    if isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("function"), dict):
        name = choice["function"].get("name")
        if name not in names:
            raise InvalidGrammar(f"tool_choice names {name}, which is not in tools", "tool_choice")
        return ToolSpec(parsed, "required", (name,), False)
    raise InvalidGrammar('tool_choice must be "none", "auto", "required" or {"type": "function", '
                         '"function": {"name": ...}}', "tool_choice")


_SUBSCHEMAS = ("items", "additionalItems", "not", "if", "then", "else", "contains")
_SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")


def closed(schema):
    """A copy of a tool's argument schema in which every object admits only the properties it
    declares, unless it says otherwise (OpenAI's strict semantics): the arguments a model writes are
    then exactly the declared ones, never extra keys it fills until max_tokens."""
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    for key in _SUBSCHEMAS:
        if key in out:
            out[key] = closed(out[key])
    for key in _SCHEMA_LISTS:
        if isinstance(out.get(key), list):
            out[key] = [closed(s) for s in out[key]]
    for key in _SCHEMA_MAPS:
        if isinstance(out.get(key), dict):
            out[key] = {k: closed(s) for k, s in out[key].items()}
    is_object = out.get("type") == "object" or (isinstance(out.get("type"), list) and "object" in out["type"]) \
        or "properties" in out
    if is_object and "additionalProperties" not in out and "patternProperties" not in out:
        out["additionalProperties"] = False
    return out


def _call_schema(spec: ToolSpec) -> dict:
    by_name = {t.name: t for t in spec.tools}
    return {"anyOf": [{"type": "object", "properties": {"name": {"const": n}, "arguments": closed(by_name[n].parameters)},
                       "required": ["name", "arguments"], "additionalProperties": False} for n in spec.callable]}


def validate_parameters(spec: ToolSpec, vocab) -> None:
    """Each tool's parameters compile as a JSON schema (a 400 naming the tool otherwise)."""
    for i, t in enumerate(spec.tools):
        param = f"tools[{i}].function.parameters"
        try:
            vocab.validate(json_schema_grammar(t.parameters, param))
        except InvalidGrammar as exc:
            raise InvalidGrammar(f"invalid JSON schema for tool {t.name}: {exc}", param) from None


# ---------------------------------------------------------------- grammars

def hermes_grammar(spec: ToolSpec) -> GrammarSpec:
    """One or more <tool_call> blocks (one when parallel calls are off), each a JSON call of
    an allowed tool with arguments valid for its schema."""
    body = json.dumps({"x-guidance": JSON_OPTIONS, **_call_schema(spec)})
    start = 'start: call ("\\n" call)*' if spec.parallel else "start: call"
    lark = f'{start}\ncall: <tool_call> "\\n" body "\\n" </tool_call>\nbody: %json {body}\n'
    return GrammarSpec(_lark(lark), "tools")


def generic_grammar(spec: ToolSpec) -> GrammarSpec:
    call = _call_schema(spec)
    calls = ({"type": "object", "properties": {"tool_calls": {"type": "array", "items": call, "minItems": 1}},
              "required": ["tool_calls"], "additionalProperties": False} if spec.parallel else
             {"type": "object", "properties": {"tool_call": call}, "required": ["tool_call"],
              "additionalProperties": False})
    response = {"type": "object", "properties": {"response": {"type": "string"}}, "required": ["response"],
                "additionalProperties": False}
    schema = calls if spec.choice == "required" else {"anyOf": [calls, response]}
    return json_schema_grammar(schema, "tools")


def _lark(text: str) -> str:
    from .structured import _llguidance

    return _llguidance().LLMatcher.grammar_from_lark(text)


def tool_constraint(session, spec: ToolSpec):
    """(the constraint, the format) for a request offering these tools to this model:
    hermes `auto` waits for <tool_call> (a lazy grammar); every other case is constrained from
    the first token."""
    from .structured import LazyConstraint

    vocab = session.grammar_vocab()
    validate_parameters(spec, vocab)
    fmt = session.tool_format()
    grammar = hermes_grammar(spec) if fmt == "hermes" else generic_grammar(spec)
    vocab.validate(grammar)
    if fmt == "hermes" and spec.choice == "auto":
        think = (vocab.token_id("<think>"), vocab.token_id("</think>"))
        return LazyConstraint(vocab, grammar.grammar, vocab.token_id(CALL_OPEN),
                              think if None not in think else None), fmt
    return vocab.constraint(grammar), fmt


def generic_system_message(spec: ToolSpec) -> dict:
    tools = "\n".join(json.dumps(t["function"], ensure_ascii=False) for t in spec.offered)
    return {"role": "system", "content": GENERIC_PROMPT.format(tools=tools)}


# ---------------------------------------------------------------- output

def new_call_id() -> str:
    return "call_" + secrets.token_hex(12)


def _call(obj) -> ToolCall | None:
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not isinstance(obj.get("arguments"), dict):
        return None
    return ToolCall(new_call_id(), obj["name"], json.dumps(obj["arguments"], ensure_ascii=False))


def _hermes_blocks(raw: str, pos: int) -> tuple[list[ToolCall], int, bool]:
    """The complete <tool_call> blocks of raw from pos: (calls, end of the last one, whether a
    block failed to parse, which ends the calls)."""
    calls = []
    while True:
        i = raw.find(CALL_OPEN, pos)
        j = raw.find(CALL_CLOSE, i + len(CALL_OPEN)) if i >= 0 else -1
        if j < 0:
            return calls, pos, False
        try:
            call = _call(json.loads(raw[i + len(CALL_OPEN):j].strip()))
        except json.JSONDecodeError:
            call = None
        if call is None:
            return calls, pos, True
        calls.append(call)
        pos = j + len(CALL_CLOSE)


def parse_hermes(text: str) -> tuple[str | None, list[ToolCall]]:
    """(content before the calls, or None; the calls) of a hermes answer."""
    calls, _, _ = _hermes_blocks(text, 0)
    if not calls:
        return text, []
    return text[:text.find(CALL_OPEN)].strip() or None, calls


def parse_generic(text: str) -> tuple[str | None, list[ToolCall]]:
    try:
        obj = json.loads(text)
    except json.JSONDecodeError:
        return text, []  # cut before the end: left as text
    if not isinstance(obj, dict):
        return text, []
    if isinstance(obj.get("response"), str):
        return obj["response"], []
    raw = obj.get("tool_calls") if "tool_calls" in obj else [obj.get("tool_call")]
    calls = [c for c in (_call(x) for x in (raw if isinstance(raw, list) else [])) if c is not None]
    return (None, calls) if calls else (text, [])


@dataclass
class ToolText:
    """A request's text with its tool calls taken out; feed/finish as TextState (inner). Content
    that may begin a call is held back; each complete call becomes one ToolCallDelta (in
    Output.calls, or pending_calls() at the end). hermes streams content and calls as they
    complete; generic answers are one JSON object, shown once it is complete. After finish(),
    text is the content and calls the parsed calls (ids stable from the first delta on)."""
    inner: object                # TextState
    format: str                  # "hermes" | "generic"
    calls: list = field(default_factory=list)
    content: str | None = None
    finished: bool = False
    _raw: str = ""
    _sent: int = 0               # characters of _raw handed out as content
    _scan: int = 0               # _raw parsed into calls up to here
    _broken: bool = False        # a call block did not parse: no more calls
    _emitted: int = 0            # calls handed out as deltas

    def feed(self, token: int) -> Output:
        d = self.inner.feed(token)
        self._raw += d.text
        return Output(self._content(final=False), d.reasoning, self.pending_calls(), stop=d.stop)

    def finish(self) -> str:
        self._raw += self.inner.finish()
        self.finished = True
        if self.format == "generic":
            self.content, self.calls = parse_generic(self._raw)
            return self.content or ""
        tail = self._content(final=True)
        if self.calls:
            self.content = self._raw[:self._raw.find(CALL_OPEN)].strip() or None
        else:
            self.content = self._raw
        return tail

    def pending_calls(self) -> tuple:
        if self.format == "hermes" and not self._broken:
            more, self._scan, self._broken = _hermes_blocks(self._raw, self._scan)
            self.calls.extend(more)
        out = tuple(ToolCallDelta(i, c.id, c.name, c.arguments) for i, c in enumerate(self.calls) if i >= self._emitted)
        self._emitted = len(self.calls)
        return out

    def _content(self, final: bool) -> str:
        if self.format != "hermes":
            return ""
        cut = self._raw.find(CALL_OPEN)
        if cut < 0:  # hold back what may be the start of <tool_call>
            cut = len(self._raw)
            if not final:
                cut -= next((k for k in range(len(CALL_OPEN) - 1, 0, -1) if self._raw.endswith(CALL_OPEN[:k])), 0)
        out = self._raw[self._sent:cut] if cut > self._sent else ""
        self._sent = max(self._sent, cut)
        return out

    @property
    def text(self) -> str:
        return (self.content or "") if self.finished else self._raw

    @property
    def reasoning(self) -> str:
        return self.inner.reasoning

    @property
    def reasoning_tokens(self) -> int:
        return self.inner.reasoning_tokens

    @property
    def stop_sequence(self) -> str | None:
        return self.inner.stop_sequence

    def pending_reasoning(self) -> str:
        return self.inner.pending_reasoning()

    @property
    def token_bytes(self):
        return self.inner.token_bytes
