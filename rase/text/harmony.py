"""gpt-oss's harmony format: a generation's messages, channel by channel.

The prompt ends with `<|start|>assistant`; the model then writes messages such as
`<|channel|>analysis<|message|>...<|end|>`, `<|start|>assistant<|channel|>final<|message|>...
<|return|>` or `<|start|>assistant<|channel|>commentary to=functions.NAME <|constrain|>json
<|message|>{...}<|call|>` (the recipient may also follow the role). HarmonyText reads them token
by token (the control tokens by id, never as text): `analysis` is reasoning, `final` (and
`commentary` without a recipient, the preamble shown to the user) is content, a message to
`functions.NAME` is a tool call whose arguments are its text. It is a TextState for the serving
engine: feed(token) -> output.Output(content, reasoning, calls, stop).
"""
from __future__ import annotations

import json
import re
from typing import Callable, Sequence

from ..output import GenerationStopReason, Output
from .stream import TextStream
from .tools import ToolCall, ToolCallDelta, new_call_id

CONTROL = ("<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>", "<|return|>", "<|call|>")
ENDS = ("<|end|>", "<|return|>", "<|call|>")  # a message's last token
_CHANNEL = re.compile(r"<\|channel\|>\s*([A-Za-z_]+)")
_RECIPIENT = re.compile(r"\bto=([^\s<]+)")
TOOL_PREFIX = "functions."


def control_ids(tokenizer) -> dict[str, int] | None:
    """Harmony's control tokens -> their ids, when each is one token of the vocabulary (a
    harmony model), else None."""
    ids = {}
    for text in CONTROL:
        got = tokenizer.encode(text, add_special_tokens=False, parse_special=True)
        if len(got) != 1:
            return None
        ids[text] = got[0]
    return ids


class Header:
    """One message's header (role, recipient, channel, content type) as its tokens arrive; the
    parts HarmonyText and the harmony constraint both need."""

    def __init__(self) -> None:
        self.text = ""

    def add(self, piece: str) -> None:
        self.text += piece

    @property
    def channel(self) -> str | None:
        m = _CHANNEL.search(self.text)
        return m.group(1) if m else None

    @property
    def recipient(self) -> str | None:
        m = _RECIPIENT.search(self.text)
        return m.group(1) if m else None

    @property
    def tool(self) -> str | None:
        """The function a message calls (to=functions.NAME), or None."""
        r = self.recipient
        return r[len(TOOL_PREFIX):] if r and r.startswith(TOOL_PREFIX) else None

    @property
    def kind(self) -> str:
        """"reasoning", "call" or "content": where the message's text goes."""
        if self.tool is not None:
            return "call"
        return "reasoning" if self.channel == "analysis" else "content"


def _arguments(text: str) -> str:
    """A call's arguments as OpenAI sends them: compact JSON of the object the model wrote,
    or the model's text as it is when it is no JSON object (the client sees what it wrote)."""
    try:
        obj = json.loads(text)
    except json.JSONDecodeError:
        return text.strip()
    return json.dumps(obj, ensure_ascii=False) if isinstance(obj, dict) else text.strip()


class HarmonyText:
    """feed(token) -> output.Output; finish(); text (content), reasoning, calls; the stop strings apply
    to the content."""

    def __init__(self, token_bytes: Callable[[int], bytes], ids: dict[str, int], stop: Sequence[str] = ()) -> None:
        self.token_bytes = token_bytes
        self._by_id = {v: k for k, v in ids.items()}
        self._stops = list(stop)
        self._header: Header | None = Header()  # the prompt ends inside an assistant header
        self._in_body, self._kind = False, "content"  # in a message's text; where it goes (Header.kind)
        self._stream = TextStream(token_bytes)
        self._content: list[str] = []
        self._reasoning: list[str] = []
        self._reasoning_sent = 0  # characters of reasoning handed out
        self.reasoning_tokens = 0  # analysis-channel tokens
        self.stop_sequence: str | None = None  # the stop string that ended the content
        self._args = ""
        self._seen_message = False
        self.calls: list[ToolCall] = []
        self._emitted = 0
        self.finished = False

    # ------------------------------------------------------------ routing

    def _route(self, piece: str) -> str:
        """The content shown from this piece of the current message's text (reasoning and call
        arguments are kept apart)."""
        if not piece:
            return ""
        if self._header is not None and not self._in_body:
            self._header.add(piece)
        elif self._kind == "reasoning":
            self._reasoning.append(piece)
        elif self._kind == "call":
            self._args += piece
        else:
            self._content.append(piece)
            return piece
        return ""

    def _new_stream(self) -> None:
        body_content = self._in_body and self._kind == "content"
        self._stream = TextStream(self.token_bytes, self._stops if body_content else ())

    def _flush(self) -> str:
        text = self._route(self._stream.finish())
        self.stop_sequence = self.stop_sequence or self._stream.matched
        return text

    def _close_message(self, complete: bool = True) -> None:
        """The message ends (a call cut short by the token limit is no call)."""
        if complete and self._in_body and self._kind == "call":
            self.calls.append(ToolCall(new_call_id(), self._header.tool, _arguments(self._args)))
        self._args = ""
        self._header, self._in_body = None, False

    def _control(self, name: str) -> None:
        if name == "<|start|>":
            self._header, self._in_body = Header(), False
        elif name == "<|message|>" and self._header is not None:
            self._in_body, self._kind, self._seen_message = True, self._header.kind, True
        elif name in ENDS:
            self._close_message()
        elif self._header is not None and not self._in_body:  # <|channel|>, <|constrain|>
            self._header.add(name)

    # ------------------------------------------------------------ TextState

    def feed(self, token: int) -> Output:
        name = self._by_id.get(token)
        self.reasoning_tokens += name is None and self._in_body and self._kind == "reasoning"
        if name is None:
            content = self._route(self._stream.push(token))
            stop = GenerationStopReason.STOP_STRING if self._stream.stopped else None
            self.stop_sequence = self.stop_sequence or self._stream.matched
        else:  # <|call|> ends the generation here (<|return|>, the EOS, never reaches feed)
            content = self._flush()
            self._control(name)
            self._new_stream()
            stop = GenerationStopReason.STOP_TOKEN if name == "<|call|>" else None
        return Output(content, self.pending_reasoning(), self.pending_calls(), stop=stop)

    def finish(self) -> str:
        if self.finished:
            return ""
        self.finished = True
        content = self._flush()
        if not self._seen_message and self._header is not None and self._header.text:
            content += self._header.text  # no harmony message at all: the text is the answer
            self._content.append(self._header.text)
        self._close_message(complete=False)
        return content

    def pending_reasoning(self) -> str:
        """Reasoning text not yet handed out."""
        r = self.reasoning
        out, self._reasoning_sent = r[self._reasoning_sent:], len(r)
        return out

    def pending_calls(self) -> tuple:
        out = tuple(ToolCallDelta(i, c.id, c.name, c.arguments) for i, c in enumerate(self.calls) if i >= self._emitted)
        self._emitted = len(self.calls)
        return out

    @property
    def text(self) -> str:
        return "".join(self._content)

    @property
    def reasoning(self) -> str:
        return "".join(self._reasoning)


# ---------------------------------------------------------------- constraints

class FinalConstraint:
    """A response format on a harmony answer: free while the model reasons (and calls), the
    grammar over the body of its `final` message, from the token after <|message|>."""

    def __init__(self, vocab, grammar: str, ids: dict[str, int], token_text: Callable[[int], str]) -> None:
        self._vocab, self._grammar, self._text = vocab, grammar, token_text
        self._by_id = {v: k for k, v in ids.items()}
        self._header: Header | None = Header()
        self._active = None

    def fill(self):
        return None if self._active is None else self._active.fill()

    def advance(self, token: int) -> None:
        from .structured import Constraint

        if self._active is not None:
            self._active.advance(token)
            return
        name = self._by_id.get(token)
        if name == "<|start|>":
            self._header = Header()
        elif name == "<|message|>" and self._header is not None:
            if self._header.channel == "final":
                self._active = Constraint(self._vocab, self._grammar)
            self._header = None
        elif name in ENDS:
            self._header = None
        elif self._header is not None:
            self._header.add(name or self._text(token))

    @property
    def complete(self) -> bool:
        return self._active is not None and self._active.complete


def _lark_string(s: str) -> str:
    return json.dumps(s)


def call_grammar(spec) -> str:
    """tool_choice required or a named tool: an optional analysis message, then one call of an
    allowed tool in harmony's form, its arguments valid JSON for the tool's schema, <|call|>."""
    from .structured import JSON_OPTIONS
    from .tools import closed

    by_name = {t.name: t for t in spec.tools}
    rules = []
    for i, name in enumerate(spec.callable):
        schema = json.dumps({"x-guidance": JSON_OPTIONS, **closed(by_name[name].parameters)})
        rules.append(f"call{i}: {_lark_string(name + ' ')} <|constrain|> \"json\" <|message|> args{i} <|call|>\n"
                     f"args{i}: %json {schema}")
    calls = " | ".join(f"call{i}" for i in range(len(spec.callable)))
    return (f"start: analysis? <|channel|> \"commentary to=functions.\" ({calls})\n"
            "analysis: <|channel|> \"analysis\" <|message|> TEXT <|end|> <|start|> \"assistant\"\n"
            "TEXT: /(.|\\n)*/\n" + "\n".join(rules) + "\n")


def harmony_constraint(session, ids: dict[str, int], spec, tools):
    """The constraint of a harmony request: a response format over the final message
    (FinalConstraint); a required call from the first token (call_grammar); a grammar or regex
    (rase's extensions) over the raw output, control tokens and all (it may name them: <|call|>)."""
    from .structured import GrammarSpec
    from .tools import _lark, validate_parameters

    vocab = session.grammar_vocab()
    if tools is not None:
        validate_parameters(tools, vocab)
        grammar = GrammarSpec(_lark(call_grammar(tools)), "tools")
        return vocab.constraint(grammar)
    if not spec.param.startswith("response_format"):
        return vocab.constraint(spec)
    vocab.validate(spec)
    return FinalConstraint(vocab, spec.grammar, ids,
                           lambda t: session.tokenizer.decode_bytes([t]).decode("utf-8", "replace"))
