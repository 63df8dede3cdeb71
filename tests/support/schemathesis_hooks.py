"""schemathesis hooks for tests/server/test_fuzz_http.py: the constraints JSON Schema cannot state.

Some request fields hold a program whose validity is a language of its own (a Lark or GBNF
grammar, a regex, a JSON schema, a call's JSON arguments), refer to another field (a
tool_choice names one of the tools), or hold an encoded image (a generated string is no PNG, and
a prompt holds at most MAX_IMAGES of them). The OpenAPI document says what they must be; a generated
string is almost never such a program, and the server answers it with a 400 that names the field.
For schema-valid (positive) cases these fields are replaced with valid values, so the checks see
everything else the generator produces; schema-violating (negative) cases are left as generated.
"""
from __future__ import annotations

import base64
from pathlib import Path

import schemathesis

GRAMMAR = 'start: "a"'
SCHEMA = {"type": "object"}


def _tools(tools, key: str) -> list:
    """Each tool's parameter schema valid (key: where a tool keeps it)."""
    out = []
    for tool in tools if isinstance(tools, list) else []:
        if isinstance(tool, dict):
            inner = tool.get("function") if isinstance(tool.get("function"), dict) else tool
            if key in inner and inner[key] is not None:
                inner[key] = dict(SCHEMA)
            out.append(tool)
    _distinct(out)
    return out


def _distinct(tools) -> None:
    """Tool names made distinct (a name repeats across the list: no schema says that)."""
    seen: set = set()
    for i, tool in enumerate(tools if isinstance(tools, list) else []):
        inner = tool.get("function") if isinstance(tool, dict) and isinstance(tool.get("function"), dict) else tool
        if isinstance(inner, dict) and isinstance(inner.get("name"), str):
            if inner["name"] in seen:
                inner["name"] = f"t{i}_{inner['name']}"[:64]
            seen.add(inner["name"])


def _names(tools) -> list[str]:
    names = []
    for tool in tools if isinstance(tools, list) else []:
        inner = tool.get("function") if isinstance(tool.get("function"), dict) else tool
        if isinstance(inner, dict) and isinstance(inner.get("name"), str):
            names.append(inner["name"])
    return names


def _openai(body: dict) -> None:
    for name in ("grammar", "regex"):
        if isinstance(body.get(name), str):
            body[name] = GRAMMAR if name == "grammar" else "a+"
    if isinstance(body.get("response_format"), dict):
        body["response_format"] = {"type": "json_object"}
    if isinstance(body.get("chat_template_kwargs"), dict):
        body["chat_template_kwargs"] = {}
    _tools(body.get("tools"), "parameters")
    names = _names(body.get("tools"))
    if isinstance(body.get("tool_choice"), dict):
        body["tool_choice"] = {"type": "function", "function": {"name": names[0]}} if names else None
    for m in body.get("messages") or []:
        for call in (m.get("tool_calls") or []) if isinstance(m, dict) else []:
            if isinstance(call, dict) and isinstance(call.get("function"), dict):
                call["function"]["arguments"] = "{}"


def _ollama(body: dict) -> None:
    options = body.get("options")
    if isinstance(options, dict) and isinstance(options.get("grammar"), str):
        options["grammar"] = GRAMMAR
    if isinstance(body.get("format"), dict):
        body["format"] = dict(SCHEMA)
    if body.get("tools") is not None:
        body["tools"] = None


def _responses(body: dict) -> None:
    text = body.get("text")
    if isinstance(text, dict) and isinstance(text.get("format"), dict) and "schema" in text["format"]:
        text["format"]["schema"] = dict(SCHEMA)
    _tools(body.get("tools"), "parameters")
    names = _names(body.get("tools"))
    if isinstance(body.get("tool_choice"), dict):
        body["tool_choice"] = {"type": "function", "name": names[0]} if names else None
    for item in body.get("input") if isinstance(body.get("input"), list) else []:
        if isinstance(item, dict) and item.get("type") == "function_call":
            item["arguments"] = "{}"
    if body.get("previous_response_id") is not None:
        body["previous_response_id"] = None
    if isinstance(body.get("chat_template_kwargs"), dict):
        body["chat_template_kwargs"] = {}


def _anthropic(body: dict) -> None:
    _tools(body.get("tools"), "input_schema")
    names = _names(body.get("tools"))
    choice = body.get("tool_choice")
    if isinstance(choice, dict) and choice.get("type") == "tool":
        if names:
            choice["name"] = names[0]
        else:
            body["tool_choice"] = None
    config = body.get("output_config")
    if isinstance(config, dict) and isinstance(config.get("format"), dict):
        config["format"]["schema"] = dict(SCHEMA)


PNG = (Path(__file__).resolve().parents[1] / "fixtures" / "vision" / "wide.png").read_bytes()
B64 = base64.b64encode(PNG).decode()
MAX_IMAGES = 2  # per request: schemathesis writes long part lists; the engine takes 64 per prompt


def _images(body) -> None:
    """Every image part holds a real image (the first MAX_IMAGES; later ones become text)."""
    seen = 0

    def part(p):
        nonlocal seen
        if not isinstance(p, dict) or p.get("type") not in ("image_url", "input_image", "image"):
            return p
        seen += 1
        if seen > MAX_IMAGES:
            return {"type": "input_text" if p["type"] == "input_image" else "text", "text": "x"}
        if p["type"] == "image_url":
            return {**p, "image_url": {"url": f"data:image/png;base64,{B64}"}}
        if p["type"] == "input_image":
            return {**p, "image_url": f"data:image/png;base64,{B64}"}
        return {**p, "source": {"type": "base64", "media_type": "image/png", "data": B64}}

    for m in body.get("messages") or (body.get("input") if isinstance(body.get("input"), list) else []) or []:
        if isinstance(m, dict) and isinstance(m.get("content"), list):
            m["content"] = [part(p) for p in m["content"]]
        if isinstance(m, dict) and isinstance(m.get("images"), list):
            m["images"] = [B64] * min(len(m["images"]), MAX_IMAGES)
    if isinstance(body.get("images"), list):
        body["images"] = [B64] * min(len(body["images"]), MAX_IMAGES)


FIXES = {"/v1/chat/completions": _openai, "/v1/completions": _openai, "/api/chat": _ollama, "/api/generate": _ollama,
         "/v1/responses": _responses, "/v1/responses/input_tokens": _responses, "/v1/messages": _anthropic,
         "/v1/messages/count_tokens": _anthropic}


@schemathesis.hook
def map_case(context, case):
    fix = FIXES.get(case.operation.path)
    meta = case.meta
    if fix is not None and isinstance(case.body, dict) and meta is not None and meta.generation.mode.is_positive:
        fix(case.body)
        _images(case.body)
    return case
