"""Chat messages -> prompt text: the seed's built-in templates (exact strings), Gemma's, and a
model's own Jinja template (tokenizer.chat_template) rendered in a sandbox.

Selection: the manifest's chat_template -> the GGUF's own template -> the format its vocabulary
names (Llama 3 headers, Phi-4's <|im_sep|>, Granite roles, Phi-3 tags, ChatML) -> the
architecture's default -> ChatTemplateError (plain completion still works).
"""
from __future__ import annotations

import json
import sys
import time
from contextvars import ContextVar
from typing import Callable, Mapping, Sequence

from ..errors import ChatTemplateError, InvalidRequest

Message = Mapping[str, str]


def message_text(content) -> str:
    """A message's content as text: a string, or OpenAI's list of text parts joined."""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(
            isinstance(p, Mapping) and p.get("type") == "text" and isinstance(p.get("text"), str) for p in content):
        return "".join(p["text"] for p in content)
    raise InvalidRequest('message content must be a string or a list of text parts '
                                  '({"type": "text", "text": ...}); other content types are not supported')


IMAGE_PARTS = ("image_url", "image")  # OpenAI's image_url part; rase's own {"type": "image", "image": ...}


def _image_payload(part: Mapping, where: str):
    if part.get("type") == "image":
        if "image" not in part:
            raise InvalidRequest(f"{where}: an image part needs 'image' (bytes, a data URI or a decoded image)")
        return part["image"]
    url = part.get("image_url")
    if isinstance(url, Mapping):
        url = url.get("url")
    if not isinstance(url, str):
        raise InvalidRequest(f'{where}: an image_url part needs "image_url": {{"url": "data:image/...;base64,..."}}')
    return url


def split_images(messages: Sequence[Message], marker: str) -> tuple[list, list]:
    """Messages with image parts in their content lists, as text holding marker where each image
    was (llama-server's join: text parts separated by a newline, none next to a marker), and the
    images' payloads in prompt order. Messages without images are returned as they are."""
    out, images = [], []
    for i, m in enumerate(messages):
        content = m.get("content") if isinstance(m, Mapping) else None
        if not isinstance(content, list) or not any(isinstance(p, Mapping) and p.get("type") in IMAGE_PARTS
                                                    for p in content):
            out.append(m)
            continue
        text, after_marker = "", False
        for j, p in enumerate(content):
            kind = p.get("type") if isinstance(p, Mapping) else None
            if kind in IMAGE_PARTS:
                images.append(_image_payload(p, f"messages[{i}].content[{j}]"))
                text, after_marker = text + marker, True
            elif kind == "text" and isinstance(p.get("text"), str):
                text += ("\n" if text and not after_marker else "") + p["text"]
                after_marker = False
            else:
                raise InvalidRequest(f"messages[{i}].content[{j}]: parts are text or images "
                                     '({"type": "text", "text": ...}, {"type": "image_url", "image_url": {"url": ...}})')
        out.append({**m, "content": text})
    return out, images


def _check(messages: Sequence[Message]) -> list[tuple[str, str]]:
    return [(m["role"], m["content"]) for m in normalize_messages(messages)]


def _tool_call(call, where: str) -> dict:
    f = call.get("function") if isinstance(call, Mapping) else None
    if not isinstance(f, Mapping) or not isinstance(f.get("name"), str):
        raise InvalidRequest(f"{where}: a tool call needs function.name and function.arguments")
    args = f.get("arguments", "{}")
    if isinstance(args, str):  # OpenAI sends a JSON string; templates expect the object
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            args = None
    if not isinstance(args, dict):
        raise InvalidRequest(f"{where}: function.arguments must be a JSON object")
    return {"id": call.get("id"), "type": "function", "function": {"name": f["name"], "arguments": args}}


def normalize_messages(messages: Sequence[Message]) -> list[dict]:
    """Messages as templates expect them: content text ("" for null), developer -> system,
    assistant tool_calls with their arguments as objects and their reasoning (as `thinking` and
    `reasoning_content`), tool results with their call id."""
    if not messages:
        raise InvalidRequest("chat messages must not be empty")
    out = []
    for i, m in enumerate(messages):
        role = m.get("role") if isinstance(m, Mapping) else None
        if not isinstance(role, str) or "content" not in m and not m.get("tool_calls"):
            raise InvalidRequest(f"each message needs a string 'role' and a 'content': {m!r}")
        content = m.get("content")
        msg = {"role": "system" if role == "developer" else role,  # an assistant's may be null (tool calls)
               "content": "" if content is None and role == "assistant" else message_text(content)}
        reasoning = m.get("reasoning_content", m.get("thinking"))
        if reasoning:  # an earlier answer's reasoning (OpenAI-style reasoning_content, Ollama's thinking)
            if role != "assistant":
                raise InvalidRequest(f"messages[{i}]: only assistant messages carry reasoning")
            # the names templates read it by: gpt-oss's `thinking`, Qwen3's `reasoning_content`
            msg["thinking"] = msg["reasoning_content"] = message_text(reasoning)
        if m.get("tool_calls"):
            if role != "assistant" or not isinstance(m["tool_calls"], list):
                raise InvalidRequest(f"messages[{i}]: only assistant messages carry a list of tool_calls")
            msg["tool_calls"] = [_tool_call(c, f"messages[{i}].tool_calls[{j}]") for j, c in enumerate(m["tool_calls"])]
        if role == "tool":
            msg["tool_call_id"] = m.get("tool_call_id")
        if m.get("name") is not None:  # the speaker (OpenAI's name), for templates that render it
            if not isinstance(m["name"], str):
                raise InvalidRequest(f"messages[{i}].name must be a string")
            msg["name"] = m["name"]
        out.append(msg)
    return out


def generic_tool_messages(messages: Sequence[Message]) -> list[dict]:
    """Tool turns as plain text, for templates that know no tools (llama.cpp's generic format):
    an assistant's calls become the JSON it would have answered, a tool result a user turn."""
    out = []
    for m in normalize_messages(messages):
        if m.get("tool_calls"):
            calls = [{"name": c["function"]["name"], "arguments": c["function"]["arguments"]} for c in m["tool_calls"]]
            body = {"tool_call": calls[0]} if len(calls) == 1 else {"tool_calls": calls}
            out.append({"role": "assistant", "content": json.dumps(body, ensure_ascii=False)})
        elif m["role"] == "tool":
            result = {"tool_call_id": m.get("tool_call_id"), "content": m["content"]}
            out.append({"role": "user", "content": json.dumps({"tool_response": result}, ensure_ascii=False)})
        else:
            out.append({k: m[k] for k in ("role", "content", "name") if k in m})
    return out


def render_chatml(messages: Sequence[Message]) -> str:
    body = "".join(f"<|im_start|>{r}\n{c}<|im_end|>\n" for r, c in _check(messages))
    return body + "<|im_start|>assistant\n"


def render_llama3(messages: Sequence[Message]) -> str:
    body = "".join(f"<|start_header_id|>{r}<|end_header_id|>\n\n{c}<|eot_id|>" for r, c in _check(messages))
    return "<|begin_of_text|>" + body + "<|start_header_id|>assistant<|end_header_id|>\n\n"


def render_mistral(messages: Sequence[Message]) -> str:
    prompt, system = "<s>", ""
    for role, content in _check(messages):
        if role == "system":
            system = content  # the last system message wins; one without a user turn is dropped
        elif role == "user":
            text = f"{system}\n\n{content}" if system else content
            system = ""
            prompt += f"[INST] {text} [/INST]"
        elif role == "assistant":
            prompt += f"{content}</s>"
        else:
            raise InvalidRequest(f"unsupported chat role for the Mistral template: {role}")
    return prompt


def render_gemma(messages: Sequence[Message]) -> str:
    """Gemma's turns; system text is folded into the first user turn (Gemma has no system role)."""
    prompt, system = "<bos>", ""
    for role, content in _check(messages):
        if role == "system":
            system = content
            continue
        if role not in ("user", "assistant", "model"):
            raise InvalidRequest(f"unsupported chat role for the Gemma template: {role}")
        if role == "user" and system:
            content, system = f"{system}\n\n{content}", ""
        turn = "model" if role in ("assistant", "model") else "user"
        prompt += f"<start_of_turn>{turn}\n{content}<end_of_turn>\n"
    return prompt + "<start_of_turn>model\n"


def render_phi3(messages: Sequence[Message]) -> str:
    """Phi-3, Phi-3.5 and Phi-4-mini's tags (llama.cpp's phi3 template)."""
    return "".join(f"<|{r}|>\n{c}<|end|>\n" for r, c in _check(messages)) + "<|assistant|>\n"


def render_phi4(messages: Sequence[Message]) -> str:
    """Phi-4's ChatML with <|im_sep|> after the role (llama.cpp's phi4 template)."""
    return "".join(f"<|im_start|>{r}<|im_sep|>{c}<|im_end|>" for r, c in _check(messages)) + \
        "<|im_start|>assistant<|im_sep|>"


def render_granite(messages: Sequence[Message]) -> str:
    """Granite 3's roles (llama.cpp's granite template)."""
    body = "".join(f"<|start_of_role|>{r}<|end_of_role|>{c}<|end_of_text|>\n" for r, c in _check(messages))
    return body + "<|start_of_role|>assistant<|end_of_role|>"


# a renderer for each name a manifest may give (store/registry.py: BUILTIN_TEMPLATES, tests/text/test_chat.py)
BUILTIN: dict[str, Callable[[Sequence[Message]], str]] = {
    "chatml": render_chatml, "llama3": render_llama3, "mistral": render_mistral,
    "llama2": render_mistral, "gemma": render_gemma, "phi3": render_phi3, "phi4": render_phi4,
    "granite": render_granite,
}

# a file without a template: the format its vocabulary's control tokens belong to, first match
VOCAB_DEFAULT = (("<|start_header_id|>", "llama3"), ("<|im_sep|>", "phi4"), ("<|start_of_role|>", "granite"),
                 ("<|assistant|>", "phi3"), ("<|im_start|>", "chatml"))

ARCH_DEFAULT = {  # the seed's for_architecture, plus the architectures rase added (when a file has no template)
    "qwen3": "chatml", "qwen3-gguf": "chatml", "llama3": "llama3", "llama": "mistral",
    "llama2": "mistral", "llama-gguf": "mistral", "mistral": "mistral", "mixtral": "mistral",
    "gemma3": "gemma", "gemma2": "gemma", "gemma": "gemma", "qwen2": "chatml", "qwen3moe": "chatml",
    "phi3": "phi3", "smollm3": "chatml", "granite": "granite",
}


# a template from a model file is untrusted code: what one render may spend
TEMPLATE_MAX_CHARS = 4 << 20      # output, and any string or list an operator builds
TEMPLATE_MAX_ITERATIONS = 1_000_000  # range() items over the whole render
TEMPLATE_MAX_SECONDS = 2.0        # wall clock, checked between output pieces


class _Budget:
    """One render's allowance; exceeding it raises ChatTemplateError."""

    def __init__(self) -> None:
        self.iterations, self.chars, self.lines = 0, 0, 0
        self.deadline = time.monotonic() + TEMPLATE_MAX_SECONDS

    def line(self, frame, event, arg):
        """A local trace function for the template's own frames: the clock every 1024 lines, so
        loops that neither write, call range() nor touch attributes are bounded too."""
        self.lines += 1
        if not self.lines & 1023:
            self.spend()
        return self.line

    def spend(self, iterations: int = 0, chars: int = 0) -> None:
        self.iterations += iterations
        self.chars += chars
        if self.iterations > TEMPLATE_MAX_ITERATIONS:
            raise ChatTemplateError(f"the model's chat template loops over {TEMPLATE_MAX_ITERATIONS} times; refused")
        if self.chars > TEMPLATE_MAX_CHARS:
            raise ChatTemplateError(f"the model's chat template writes over {TEMPLATE_MAX_CHARS} characters; refused")
        if time.monotonic() > self.deadline:
            raise ChatTemplateError(f"the model's chat template ran over {TEMPLATE_MAX_SECONDS} s; refused")


_BUDGET: ContextVar[_Budget] = ContextVar("rase_template_budget")  # the render in progress


def _counted_range(*args):
    from jinja2.sandbox import safe_range

    r = safe_range(*args)
    _BUDGET.get().spend(iterations=len(r))
    return r


def _bounded_env():
    """jinja2's immutable sandbox (no attribute escapes, no mutation of inputs) that also
    bounds operators ('*', '+' and '**' may not build huge strings, lists or numbers) and counts
    range() items (the clock is checked by _Budget.line)."""
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class Bounded(ImmutableSandboxedEnvironment):
        intercepted_binops = frozenset(["*", "+", "**"])

        def call_binop(self, context, operator, left, right):
            if operator == "**" and isinstance(left, int) and isinstance(right, int) \
                    and right * abs(left).bit_length() > 1_000_000:
                raise ChatTemplateError("the model's chat template raises a number to a huge power; refused")
            if operator == "*" and isinstance(left, int) and isinstance(right, (str, list, tuple)):
                left, right = right, left
            sized = (str, list, tuple)
            if (operator == "*" and isinstance(left, sized) and isinstance(right, int)
                    and len(left) * right > TEMPLATE_MAX_CHARS) or \
                    (operator == "+" and isinstance(left, sized) and isinstance(right, sized)
                     and len(left) + len(right) > TEMPLATE_MAX_CHARS):
                raise ChatTemplateError("the model's chat template builds a huge string; refused")
            return super().call_binop(context, operator, left, right)

    env = Bounded(trim_blocks=True, lstrip_blocks=True)
    env.globals["range"] = _counted_range
    return env


class JinjaTemplate:
    """A model's own template (HF chat_template), rendered with HF's variables in a sandbox
    bounded in loop iterations, output size and time (_Budget)."""

    def __init__(self, source: str, bos_token: str = "", eos_token: str = "") -> None:
        from jinja2 import TemplateError

        def raise_exception(message: str) -> None:
            raise ChatTemplateError(f"the model's chat template refused the messages: {message}")

        env = _bounded_env()
        env.globals["raise_exception"] = raise_exception
        env.globals["strftime_now"] = lambda fmt: time.strftime(fmt)  # as transformers (today's date)
        # as transformers renders: no key sorting, no HTML escaping (tool schemas look as in training)
        env.filters["tojson"] = lambda x, ensure_ascii=False, indent=None, separators=None, sort_keys=False: \
            json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)
        try:
            self.template = env.from_string(source)
        except TemplateError as exc:
            raise ChatTemplateError(f"the model's chat template does not parse: {exc}") from None
        self.bos_token, self.eos_token = bos_token, eos_token
        self.source = source
        self.renders_tools = "tools" in source  # the template itself lays out a tools list

    def render(self, messages: Sequence[Message], add_generation_prompt: bool = True, **extra) -> str:
        from jinja2 import TemplateError

        msgs = normalize_messages(messages)
        budget = _Budget()
        token = _BUDGET.set(budget)
        # trace only the compiled template's frames (their code is "<template>"); a debugger's or
        # coverage tool's trace function is put back after
        previous = sys.gettrace()
        sys.settrace(lambda frame, event, arg: budget.line if frame.f_code.co_filename == "<template>" else None)
        out: list[str] = []
        try:
            for piece in self.template.generate(messages=msgs, add_generation_prompt=add_generation_prompt,
                                                bos_token=self.bos_token, eos_token=self.eos_token, **extra):
                budget.spend(chars=len(piece))
                out.append(piece)
        except ChatTemplateError:
            raise
        except TemplateError as exc:
            raise ChatTemplateError(f"the model's chat template failed: {exc}") from None
        except (ArithmeticError, RecursionError, MemoryError, TypeError, ValueError, LookupError) as exc:
            raise ChatTemplateError(f"the model's chat template failed: {type(exc).__name__}: {exc}") from None
        finally:
            sys.settrace(previous)
            _BUDGET.reset(token)
        return "".join(out)


def select_template(name: str | None, gguf=None, architecture: str | None = None) -> Callable[[Sequence[Message]], str]:
    """manifest name -> the GGUF's template -> architecture default -> ChatTemplateError."""
    if name is not None and name != "gguf":
        key = name.lower()
        if key not in BUILTIN:
            raise ChatTemplateError(f"unknown chat template {name!r}; known: {', '.join(sorted(BUILTIN))}, gguf")
        return BUILTIN[key]
    source = gguf.get("tokenizer.chat_template") if gguf is not None else None
    if isinstance(source, str) and source.strip():
        tokens = gguf.get("tokenizer.ggml.tokens") or []
        def piece(key: str) -> str:
            i = gguf.get(key)
            return tokens[i] if isinstance(i, int) and 0 <= i < len(tokens) else ""
        jt = JinjaTemplate(source, piece("tokenizer.ggml.bos_token_id"), piece("tokenizer.ggml.eos_token_id"))
        return jt.render
    if name == "gguf":
        raise ChatTemplateError("chat_template = 'gguf' but the model file has no tokenizer.chat_template")
    vocab = set(gguf.get("tokenizer.ggml.tokens") or []) if gguf is not None else set()
    default = next((fmt for token, fmt in VOCAB_DEFAULT if token in vocab), None)
    default = default or ARCH_DEFAULT.get((architecture or "").lower())
    if default is None:
        raise ChatTemplateError(
            f"no chat template for architecture {architecture!r}: set one with "
            f"`rase model import --chat-template NAME` ({', '.join(sorted(BUILTIN))}); plain completion works")
    return BUILTIN[default]
