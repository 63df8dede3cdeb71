"""The prefix a request's prompt starts with, as a routing key: requests with the same key go
to the same replica, whose prefix cache then holds their shared beginning.

A chat's key is its model and its opening (every message up to and including the first user
message): later turns of the conversation repeat the opening, so they follow the first turn. A
completion's key is its model and the first PROMPT_BLOCK characters of the prompt. Anything
else (model lists, tokenize, bodies that are not JSON) has no key and goes where load is lowest.
"""
from __future__ import annotations

import hashlib
import json

PROMPT_BLOCK = 256  # characters of a completion prompt that name its prefix
OPENING_LIMIT = 4096  # characters of a chat opening kept (a long system prompt names itself by then)

CHAT_PATHS = ("/v1/chat/completions", "/api/chat")
PROMPT_PATHS = ("/v1/completions", "/api/generate")


def _text(content) -> str:
    """A message's content: a string, or the text of its content parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return ""


def _opening(messages) -> str | None:
    if not isinstance(messages, list) or not messages:
        return None
    parts = []
    for m in messages:
        if not isinstance(m, dict):
            return None
        parts.append(f"{m.get('role')}\n{_text(m.get('content'))}\n")
        if m.get("role") == "user":
            break
    return "".join(parts)[:OPENING_LIMIT]


def route_key(path: str, body: bytes) -> str | None:
    """The request's key (a hex digest), or None when it has no prompt to keep together."""
    if path not in CHAT_PATHS and path not in PROMPT_PATHS:
        return None
    try:
        req = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(req, dict):
        return None
    if path in CHAT_PATHS:
        prefix = _opening(req.get("messages"))
    else:
        prompt = req.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1:
            prompt = prompt[0]
        system = req.get("system") if isinstance(req.get("system"), str) else ""
        prefix = (system + "\n" + prompt)[:PROMPT_BLOCK] if isinstance(prompt, str) else None
    if prefix is None:
        return None
    return hashlib.blake2b(f"{req.get('model')}\n{prefix}".encode(), digest_size=16).hexdigest()


def rendezvous_order(key: str, names: list[str]) -> list[int]:
    """Indices of names, most preferred first, by highest-random-weight hashing: the same key
    and names give the same order everywhere; removing a name moves only the keys it was first for."""
    def weight(name: str) -> int:
        return int.from_bytes(hashlib.blake2b(f"{key}|{name}".encode(), digest_size=8).digest(), "big")
    return sorted(range(len(names)), key=lambda i: weight(names[i]), reverse=True)
