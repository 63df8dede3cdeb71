"""What a request asks, made into what a model's worker runs: its generation config, its prompt
ids, and how its output is read (the text state: <think> blocks, tool calls, harmony channels)
and constrained (structured output, tool grammars, the reasoning gate)."""
from __future__ import annotations

import json

from ..errors import InvalidGenerationConfig, InvalidGrammar, InvalidRequest
from ..text.harmony import HarmonyText, harmony_constraint
from ..engine.sampling import GenerationConfig
from ..text.textstate import TextState
from ..text.thinking import ReasoningGate
from ..text.tools import ToolSpec, ToolText, tool_constraint

GEN_FIELDS = ("max_tokens", "temperature", "top_k", "seed", "top_p", "min_p", "repeat_penalty",
              "presence_penalty", "frequency_penalty", "stop_tokens", "logit_bias", "draft_max", "draft_min")
EFFORTS = ("none", "minimal", "low", "medium", "high")  # OpenAI's reasoning_effort values


def generation_config(kw: dict) -> GenerationConfig:
    unknown = sorted(set(kw) - set(GEN_FIELDS))
    if unknown:
        raise InvalidGenerationConfig(f"unknown generation option(s): {', '.join(unknown)}; "
                                      f"supported: {', '.join(GEN_FIELDS)}")
    # None means "the default", except top_k=None: no top-k (the whole vocabulary), as in GenerationConfig
    values = {k: kw[k] for k in kw if kw[k] is not None or k == "top_k"}
    if "stop_tokens" in values:
        values["stop_tokens"] = tuple(int(t) for t in values["stop_tokens"])
    if "logit_bias" in values:  # {token id: bias}, as OpenAI's (string keys over JSON)
        bias = values["logit_bias"]
        if not isinstance(bias, dict):
            raise InvalidGenerationConfig("logit_bias must map token ids to numbers")
        try:
            values["logit_bias"] = tuple(sorted((int(k), float(v)) for k, v in bias.items()))
        except (TypeError, ValueError):
            raise InvalidGenerationConfig("logit_bias must map token ids to numbers") from None
    return GenerationConfig(**values)


def top_count(logprobs: bool, top: int | None, most: int) -> int | None:
    """OpenAI's chat logprobs / top_logprobs -> alternatives per token, or None (off)."""
    if top is not None:
        if not logprobs:
            raise InvalidGenerationConfig("top_logprobs needs logprobs: true", "top_logprobs")
        if isinstance(top, bool) or not isinstance(top, int) or not 0 <= top <= most:
            raise InvalidGenerationConfig(f"top_logprobs must be an integer in 0..{most}", "top_logprobs")
    return (top or 0) if logprobs else None


def reader(session, spec, tools: ToolSpec | None, stops: list[str], think: str, chat: bool, prompt: list[int],
            budget: int | None = None, stop_tokens=(), default_budget: int | None = None) -> tuple:
    """(the text state, the constraint) of a request: a harmony model's chat answers are read by
    channel (harmony.py); every other answer is text, with its tool calls taken out when tools
    are offered (tools.ToolText) and, for a model that reasons in <think> blocks, its reasoning
    separated (think "separate", or "auto") and left unconstrained (thinking.ReasoningGate)."""
    harmony = session.harmony_ids() if chat else None
    if harmony is not None and budget not in (None, -1):
        raise InvalidRequest("a reasoning budget bounds a <think> block; gpt-oss reasons in its analysis channel, "
                             "which reasoning_effort sets", "reasoning_budget")
    budget = default_budget if budget is None else None if budget == -1 else budget
    if harmony is not None:
        text = HarmonyText(lambda t: session.tokenizer.decode_bytes([t]), harmony, stops)
        if spec is None and (tools is None or tools.choice == "auto"):
            return text, None
        return text, harmony_constraint(session, harmony, spec, tools if spec is None else None)
    if spec is not None and tools is not None:  # only harmony's raw output takes both
        raise InvalidGrammar("tools and a grammar/regex combine only on a harmony model (gpt-oss)", "tools")
    tags = session.reasoning_tags() if chat else None
    last = last_word(session, prompt) if tags is not None else None
    opened = last == tags[0] if tags is not None else False
    if last == (tags[1] if tags is not None else None):
        tags = None  # the template closed the block itself (thinking off): nothing to separate or gate
    if think == "auto":
        think = "separate" if tags is not None else "keep"
    constraint = None if spec is None else session.grammar_vocab().constraint(spec)
    text = TextState.for_tokenizer(session.tokenizer, stop=stops, think=think, opened=opened)
    if tools is not None:
        constraint, fmt = tool_constraint(session, tools)
        text = ToolText(text, fmt)
    if tags is not None and (constraint is not None or budget is not None):
        n_words = (session.plan.vocab_size + 31) // 32
        ends = list(stop_tokens) or [session.plan.eos_token]  # none may end a constrained answer mid-reasoning
        constraint = ReasoningGate(constraint, tags, n_words, [t for t in ends if t is not None], opened, budget)
    return text, constraint


def last_word(session, prompt: list[int]) -> int | None:
    """The prompt's last token other than whitespace: <think> when the template opened a
    reasoning block (Qwen3.5, DeepSeek-R1), </think> when it wrote an empty one (thinking off)."""
    for t in reversed(prompt):
        if t >= 0 and session.tokenizer.decode_bytes([t]).strip():  # an image's rows are no words
            return t
    return None


_TEMPLATE_RESERVED = {"messages", "add_generation_prompt", "bos_token", "eos_token", "tools", "reasoning_effort"}


def template_kwargs(kwargs) -> dict | None:
    """chat_template_kwargs checked: names of template variables (not the ones rase sets itself),
    values JSON data."""
    if kwargs is None:
        return None
    if not isinstance(kwargs, dict):
        raise InvalidRequest("chat_template_kwargs must be an object", "chat_template_kwargs")
    for key, value in kwargs.items():
        if not isinstance(key, str) or not key.isidentifier() or key.startswith("_") or key in _TEMPLATE_RESERVED:
            raise InvalidRequest(f"chat_template_kwargs: {key!r} is not a template variable a request may set "
                                 f"(identifiers, not {', '.join(sorted(_TEMPLATE_RESERVED))})", "chat_template_kwargs")
        try:
            json.dumps(value)
        except (TypeError, ValueError):
            raise InvalidRequest(f"chat_template_kwargs.{key} must be JSON data", "chat_template_kwargs") from None
    return dict(kwargs)


def prompt_ids(session, prompt, parse_special: bool = True) -> list[int]:
    """A completion prompt's ids: text encoded with the automatic special tokens (special-token
    text such as <|im_start|> as those tokens, as llama-server and Ollama's raw mode read it,
    unless parse_special is False), or ids checked."""
    if isinstance(prompt, str):
        return session.tokenizer.encode(prompt, add_special_tokens=True, parse_special=parse_special)
    vocab = session.plan.vocab_size
    if not isinstance(prompt, (list, tuple)) or not prompt or \
            not all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < vocab for t in prompt):
        raise InvalidRequest(f"prompt must be text or a non-empty list of token ids in 0..{vocab - 1}", "prompt")
    return list(prompt)
