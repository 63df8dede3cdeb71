"""Constrained decoding: a request's grammar (a JSON schema, any JSON object, a regex, a Lark or
GBNF grammar) becomes, before every draw, a bitmask of the tokens that keep the output inside
it; the C sampler sees only those tokens (llguidance computes the mask, GIL released).

GrammarVocab is built once per loaded model (the vocabulary as bytes); GrammarSpec is what a
request asked for, validated before any generation (InvalidGrammar names the field);
Constraint is one request's matcher: fill() the next mask, advance(token), complete.
"""
from __future__ import annotations

import re
import threading
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from ..errors import InvalidGrammar, InvalidLogits, MissingDependency

# json.dumps-style separators, no free whitespace: llguidance's default allows unbounded
# whitespace, and a wandering model then pads until max_tokens. "x-guidance" in a schema overrides.
JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
# user-defined tokens that grammars name as special tokens (<tool_call> ...); not every <...>
# token: Gemma's HTML tags must stay usable inside JSON strings
NAMED_SPECIAL = ("<tool_call>", "</tool_call>", "<think>", "</think>")
_SCHEMA_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
_CACHE_SIZE = 64  # validated grammars kept per model


def _llguidance():
    try:
        import llguidance
    except ImportError:  # pragma: no cover - a declared dependency
        raise MissingDependency("constrained decoding needs llguidance: pip install 'llguidance>=1.9,<2'") from None
    return llguidance


@dataclass(frozen=True)
class GrammarSpec:
    grammar: str   # llguidance's grammar text
    param: str     # the request field it came from (named in errors)


def json_schema_grammar(schema, param: str) -> GrammarSpec:
    if not isinstance(schema, dict):
        raise InvalidGrammar(f"{param} must be a JSON object", param)
    try:
        text = _llguidance().LLMatcher.grammar_from_json_schema(schema, defaults=JSON_OPTIONS)
    except (ValueError, TypeError) as exc:
        raise InvalidGrammar(f"invalid JSON schema: {exc}", param) from None
    return GrammarSpec(text, param)


def _response_format(rf) -> GrammarSpec | None:
    if not isinstance(rf, dict) or not isinstance(rf.get("type"), str):
        raise InvalidGrammar("response_format must be an object with a type: text, json_object or json_schema",
                             "response_format")
    kind = rf["type"]
    extra = sorted(set(rf) - {"type", "json_schema"} - ({"schema"} if kind == "json_object" else set()))
    if extra:
        raise InvalidGrammar(f"response_format: unknown field(s) {', '.join(extra)}", "response_format")
    if kind == "text":
        return None
    if kind == "json_object":  # any JSON object (a schema may be given, as llama-server allows)
        return json_schema_grammar(rf.get("schema", {"type": "object"}), "response_format.schema")
    if kind != "json_schema":
        raise InvalidGrammar(f"response_format.type {kind!r} is not supported; use text, json_object or json_schema",
                             "response_format.type")
    js = rf.get("json_schema")
    if not isinstance(js, dict):
        raise InvalidGrammar("response_format.json_schema must be an object with name and schema",
                             "response_format.json_schema")
    unknown = sorted(set(js) - {"name", "schema", "strict", "description"})
    if unknown:
        raise InvalidGrammar(f"response_format.json_schema: unknown field(s) {', '.join(unknown)}",
                             "response_format.json_schema")
    name = js.get("name")
    if not isinstance(name, str) or not _SCHEMA_NAME.match(name):
        raise InvalidGrammar("response_format.json_schema.name must match ^[a-zA-Z0-9_-]{1,64}$",
                             "response_format.json_schema.name")
    if "strict" in js and not isinstance(js["strict"], bool) and js["strict"] is not None:
        raise InvalidGrammar("response_format.json_schema.strict must be a boolean",
                             "response_format.json_schema.strict")
    # strict or not, the schema is enforced as written
    return json_schema_grammar(js.get("schema", {}), "response_format.json_schema.schema")


def grammar_spec(response_format=None, grammar=None, regex=None) -> GrammarSpec | None:
    """The one constraint a request asked for (OpenAI's response_format, or the extensions
    grammar = Lark or GBNF text, regex = a pattern the whole output must match), or None."""
    given = [k for k, v in (("response_format", response_format), ("grammar", grammar), ("regex", regex))
             if v is not None]
    if len(given) > 1:
        raise InvalidGrammar(f"give one of response_format, grammar and regex, not {' and '.join(given)}", given[1])
    llg = _llguidance()
    if response_format is not None:
        return _response_format(response_format)
    if grammar is not None:
        if not isinstance(grammar, str) or not grammar.strip():
            raise InvalidGrammar("grammar must be a non-empty Lark or GBNF grammar", "grammar")
        try:
            return GrammarSpec(llg.grammar_from("grammar", grammar), "grammar")
        except Exception as exc:  # the GBNF converter's own error type
            raise InvalidGrammar(f"invalid grammar: {exc}", "grammar") from None
    if regex is not None:
        if not isinstance(regex, str) or not regex:
            raise InvalidGrammar("regex must be a non-empty pattern", "regex")
        return GrammarSpec(llg.LLMatcher.grammar_from_regex(regex), "regex")
    return None


class _Words:
    """What llguidance.TokenizerWrapper reads: every id's bytes, EOS/BOS, the special ids."""

    def __init__(self, tokenizer, n_model: int, eos: list[int], special: list[int]) -> None:
        n = tokenizer.n_vocab
        self.tokens = [tokenizer.decode_bytes([i], skip_special_tokens=False) for i in range(n)]
        self.tokens += [b""] * (n_model - n)  # ids past the tokenizer's table: never allowed
        self.eos_token_id, self.bos_token_id = eos[0], tokenizer.bos_id
        self.special_token_ids = special
        self._tok = tokenizer

    def __call__(self, text) -> list[int]:  # llguidance tokenizes literal text with this
        if isinstance(text, bytes):
            text = text.decode("utf-8", "replace")
        return self._tok.encode_piece(text)


class GrammarVocab:
    """A model's vocabulary for llguidance (built once per loaded model, ~0.2 s at 49k tokens)
    and a small cache of validated grammars."""

    def __init__(self, tokenizer, n_vocab: int, eos_ids) -> None:
        llg = _llguidance()
        eos = [int(e) for e in eos_ids if e is not None]
        if not eos:
            raise InvalidGrammar("this model declares no end-of-sequence token; a grammar cannot end its output")
        self.n_vocab, self.n_words, self.eos = n_vocab, (n_vocab + 31) // 32, eos
        path = getattr(tokenizer, "path", None)
        if path is not None:  # an attached tokenizer.json: llguidance reads the file itself
            self.lltok = llg.LLTokenizer(str(path), n_vocab=n_vocab, eos_token=eos)
        else:
            words = _Words(tokenizer, n_vocab, eos, _special_ids(tokenizer))
            self.lltok = llg.LLTokenizer(llg.TokenizerWrapper(words), n_vocab=n_vocab, eos_token=eos)
        self._valid: OrderedDict[str, None] = OrderedDict()
        self._lock = threading.Lock()

    def validate(self, spec: GrammarSpec) -> None:
        """Raise InvalidGrammar (naming spec.param) unless the grammar compiles for this vocabulary."""
        with self._lock:
            if spec.grammar in self._valid:
                self._valid.move_to_end(spec.grammar)
                return
        is_error, messages = _llguidance().LLMatcher.validate_grammar_with_warnings(spec.grammar, self.lltok)
        if is_error:
            what = "JSON schema" if "schema" in spec.param else spec.param
            raise InvalidGrammar(f"invalid {what}: {messages[0]} (rase enforces llguidance's subset; "
                                 "see its json_schema.md / syntax.md)", spec.param)
        with self._lock:
            self._valid[spec.grammar] = None
            while len(self._valid) > _CACHE_SIZE:
                self._valid.popitem(last=False)

    def constraint(self, spec: GrammarSpec) -> "Constraint":
        self.validate(spec)
        return Constraint(self, spec.grammar)

    def token_id(self, text: str) -> int | None:
        """The id of a special token named by its text (<tool_call>), or None."""
        ids = self.lltok.tokenize_str(text, parse_special=True)
        return ids[0] if len(ids) == 1 and self.lltok.is_special_token(ids[0]) else None


def _special_ids(tokenizer) -> list[int]:
    from .tokenizer import T_CONTROL

    impl = tokenizer._impl
    types, tokens = getattr(impl, "types", None), getattr(impl, "tokens", None)
    if types is None:
        return []
    named = set(NAMED_SPECIAL)
    return [i for i, t in enumerate(types) if t == T_CONTROL or tokens[i] in named]


class Constraint:
    """One request's grammar state. fill() writes the mask of the next draw (EOS only once the
    grammar is complete); advance(token) moves past a sampled token; complete: nothing may
    follow (generation ends without another forward)."""

    def __init__(self, vocab: GrammarVocab, grammar: str) -> None:
        self._m = _llguidance().LLMatcher(vocab.lltok, grammar, log_level=0)
        if self._m.is_error():
            raise InvalidGrammar(f"grammar rejected: {self._m.get_error()}")
        self.mask = np.full(vocab.n_words, -1, np.int32)

    def fill(self) -> np.ndarray:
        self._m.unsafe_compute_mask_ptr(self.mask.ctypes.data, self.mask.nbytes)
        if self._m.is_error():
            raise InvalidLogits(f"grammar matcher failed: {self._m.get_error()}")
        return self.mask

    def advance(self, token: int) -> None:
        if not self._m.consume_token(int(token)):  # the mask allowed it: a bug, never user error
            raise InvalidLogits(f"the grammar rejected token {token}: {self._m.get_error()}")

    @property
    def complete(self) -> bool:
        return self._m.is_stopped()

    def draft_masks(self, drafts: list[int]) -> tuple[list[int], list[np.ndarray]]:
        """(the drafts the grammar allows from here, a prefix; the mask of the row after each),
        the grammar left where it was. Speculation's rows draw with these masks, as decoding one
        token at a time would after each draft; a draft that ends the grammar ends the run."""
        masks: list[np.ndarray] = []
        consumed = 0
        for token in drafts[:self._m.validate_tokens(drafts)]:
            if not self._m.consume_token(int(token)):
                break
            consumed += 1
            if self._m.is_stopped():
                break
            mask = np.empty_like(self.mask)
            self._m.unsafe_compute_mask_ptr(mask.ctypes.data, mask.nbytes)
            masks.append(mask)
        self._m.rollback(consumed)
        return list(drafts[:len(masks)]), masks

    @property
    def accepting(self) -> bool:
        return self._m.is_accepting()



class LazyConstraint:
    """Free text until the model writes the trigger token (hermes <tool_call>, outside any
    <think> block), then the grammar from that token on: tool_choice "auto"."""

    def __init__(self, vocab: GrammarVocab, grammar: str, trigger: int, think: tuple[int, int] | None = None) -> None:
        self._vocab, self._grammar, self.trigger, self._think = vocab, grammar, trigger, think
        self._active: Constraint | None = None
        self._thinking = False

    def fill(self) -> np.ndarray | None:
        return None if self._active is None else self._active.fill()

    def advance(self, token: int) -> None:
        if self._active is not None:
            self._active.advance(token)
        elif self._think is not None and token in self._think:
            self._thinking = token == self._think[0]
        elif token == self.trigger and not self._thinking:
            self._active = Constraint(self._vocab, self._grammar)
            self._active.advance(token)

    @property
    def complete(self) -> bool:
        return self._active is not None and self._active.complete
