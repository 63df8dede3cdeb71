"""OpenAI request bodies (validated by pydantic; 422s are turned into OpenAI 400s).

A field the server does not implement is a 400 that names it, never silently dropped: bodies
forbid unknown keys, and message fields rase does not render must be absent or null.
"""
from __future__ import annotations

from typing import Annotated, Any, Literal, Optional, Union

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, WithJsonSchema, field_validator, model_validator

from ..text.chat import message_text
from ..errors import InvalidRequest


# a registered model id (rase.store.registry's rule), stated in the OpenAPI document
MODEL_ID_PATTERN = r"^[A-Za-z0-9_-]+$"
ModelId = Annotated[str, Field(pattern=MODEL_ID_PATTERN, description="a model id from /v1/models")]

# a field clients may send only as null or not at all (the server refuses any value by name)
Unsupported = WithJsonSchema({"type": "null", "description": "not supported: null or absent"})
# such a field where nothing else checks it: any value but null is a 400 naming it
Absent = Annotated[None, Unsupported]


def _integral(value):
    """JSON Schema's integer includes 5.0: take it as 5 (strict ints refuse floats otherwise)."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


# an integer field of a request body (strict: no strings, no booleans; 5.0 is 5)
Int = Annotated[int, BeforeValidator(_integral)]

# what clients echo back from a response message (null for a plain answer)
_NULL_MESSAGE_FIELDS = ("refusal", "function_call", "audio", "annotations")


def _only(role: str, field: str, given: dict) -> dict:
    """JSON Schema: a message with field (as given) has this role."""
    return {"if": {"required": [field], "properties": {field: given}}, "then": {"properties": {"role": {"const": role}}}}


class ImageUrl(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    url: str = Field(description="data:image/...;base64,... (or bare base64); URLs are not fetched")
    # every image is read at the encoder's full resolution: "low" cannot be honoured
    detail: Optional[Literal["auto", "high"]] = None


class TextPart(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    type: Literal["text"]
    text: str


class ImagePart(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    type: Literal["image_url"]
    image_url: Union[ImageUrl, str]  # OpenAI's object; a bare URL string as some clients send


Part = Annotated[Union[TextPart, ImagePart], Field(discriminator="type")]


class Message(BaseModel):
    # content is required, except (null or absent) in an assistant's tool-call message; tool calls
    # and reasoning are an assistant's, a tool_call_id a tool result's
    model_config = ConfigDict(extra="forbid", strict=True, json_schema_extra={"allOf": [
        {"anyOf": [{"required": ["content"], "properties": {"content": {"type": ["string", "array"]}}},
                   {"required": ["role", "tool_calls"],
                    "properties": {"role": {"const": "assistant"}, "tool_calls": {"type": "array", "minItems": 1}}}]},
        _only("assistant", "tool_calls", {"type": "array", "minItems": 1}),
        _only("assistant", "reasoning_content", {"type": "string", "minLength": 1}),
        _only("tool", "tool_call_id", {"type": "string"})]})
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Union[str, list[Part], None] = None  # null only for an assistant's tool calls; parts: text and images
    name: Optional[str] = None                  # the speaker (a tool result's: its function), passed to the template
    tool_calls: Optional[list[ToolCall]] = None
    tool_call_id: Optional[str] = None
    reasoning_content: Optional[str] = None     # an assistant's reasoning, as this server returned it

    @model_validator(mode="before")
    @classmethod
    def _no_unsupported(cls, value):
        if isinstance(value, dict):
            set_ = [k for k in _NULL_MESSAGE_FIELDS if value.get(k) not in (None, [], "")]
            if set_:
                raise ValueError(f"message field {set_[0]!r} is not supported")
            if value.get("content") is None and not (value.get("role") == "assistant" and value.get("tool_calls")):
                raise ValueError("content is required (it may be null only for an assistant's tool_calls)")
            if value.get("tool_call_id") is not None and value.get("role") != "tool":
                raise ValueError("only a tool message carries a tool_call_id")
            value = {k: v for k, v in value.items() if k not in _NULL_MESSAGE_FIELDS}
        return value

    @field_validator("content", mode="before")
    @classmethod
    def _text_parts(cls, value):
        """Text parts joined into the text (as before); a list holding images kept as parts."""
        if isinstance(value, list) and any(isinstance(p, dict) and p.get("type") == "image_url" for p in value):
            for p in value:
                url = p.get("image_url") if isinstance(p, dict) else None
                if isinstance(url, dict) and url.get("detail") not in (None, "auto", "high"):
                    raise ValueError(f"image_url.detail {url['detail']!r} cannot be honoured: rase reads every image "
                                     "at its encoder's full resolution; send \"auto\" or leave detail out")
            return value
        if value is None:
            return None
        extra = [k for p in value if isinstance(p, dict) for k in p if k not in ("type", "text")] \
            if isinstance(value, list) else []
        if extra:
            raise ValueError(f"a text part takes type and text; {extra[0]!r} is not supported")
        try:
            return message_text(value)
        except InvalidRequest as exc:
            raise ValueError(str(exc).replace("other content types", "parts other than text and image_url")) from None


class CallFunction(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    name: str
    arguments: str = "{}"  # JSON text of an object (a 400 otherwise)


# a function's name, as OpenAI bounds it (tools.py checks the same)
FunctionName = Annotated[str, Field(pattern=r"^[a-zA-Z0-9_-]{1,64}$")]


class FunctionDef(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    name: FunctionName
    description: Optional[str] = None
    parameters: Optional[dict[str, Any]] = None  # a JSON schema (an object's)
    strict: Optional[bool] = None


class FunctionTool(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    type: Literal["function"]
    function: FunctionDef


class ToolCall(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    id: str
    type: Literal["function"] = "function"
    function: CallFunction


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    include_usage: bool = False


def _one_of(*names: str) -> dict:
    """JSON Schema: no two of these fields are given (non-null) together."""
    pairs = [(a, b) for i, a in enumerate(names) for b in names[i + 1:]]
    return {"not": {"anyOf": [{"required": [a, b], "properties": {a: {"not": {"type": "null"}},
                                                                   b: {"not": {"type": "null"}}}} for a, b in pairs]}}


def not_with(field: str, other: str) -> dict:
    """JSON Schema: field (a non-empty list) and other (non-null) are not given together."""
    return {"not": {"required": [field, other], "properties": {field: {"type": "array", "minItems": 1},
                                                               other: {"not": {"type": "null"}}}}}


def needs(field: str, other: str, unless=None) -> dict:
    """JSON Schema: field (given, non-null, not `unless`) needs other as a non-empty list."""
    given = {"not": {"type": "null"}} if unless is None else {"not": {"anyOf": [{"type": "null"}, {"const": unless}]}}
    return {"if": {"required": [field], "properties": {field: given}},
            "then": {"required": [other], "properties": {other: {"type": "array", "minItems": 1}}}}


class _Common(BaseModel):
    # response_format, grammar and regex exclude each other (structured.grammar_spec)
    model_config = ConfigDict(extra="forbid", strict=True, json_schema_extra=_one_of("response_format", "grammar", "regex"))
    model: ModelId
    max_tokens: Optional[Int] = Field(default=None, ge=1)
    temperature: Optional[float] = Field(default=None, ge=0.0, le=5.0)
    top_p: Optional[float] = Field(default=None, gt=0.0, le=1.0)
    top_k: Optional[Int] = Field(default=None, ge=1)
    min_p: Optional[float] = Field(default=None, ge=0.0, le=1.0)
    seed: Optional[Int] = Field(default=None, ge=0)
    stop: Optional[Union[str, list[str]]] = None
    stream: bool = False
    stream_options: Optional[StreamOptions] = None
    presence_penalty: Optional[float] = Field(default=None, ge=-2.0, le=2.0)
    frequency_penalty: Optional[float] = Field(default=None, ge=-2.0, le=2.0)
    n: Int = Field(default=1, ge=1, le=8)  # choices; the prompt is computed once
    user: Optional[str] = None  # the caller's end-user id: accepted, recorded nowhere
    # token id (a decimal string, within the vocabulary) -> a bias in [-100, 100]
    logit_bias: Optional[dict[Annotated[str, Field(pattern=r"^[0-9]+$")], Annotated[float, Field(ge=-100, le=100)]]] = None
    response_format: Optional[dict[str, Any]] = None
    grammar: Optional[Annotated[str, Field(min_length=1)]] = None  # extension (llama-server's): Lark or GBNF
    regex: Optional[Annotated[str, Field(min_length=1)]] = None    # extension: a regex the whole output matches
    # llama-server's speculation bounds (rase serve --spec): drafts per step at most / at least
    speculative_n_max: Optional[Int] = Field(default=None, ge=0, alias="speculative.n_max")
    speculative_n_min: Optional[Int] = Field(default=None, ge=0, alias="speculative.n_min")
    speculative_p_min: Annotated[Optional[float], Unsupported] = Field(default=None, alias="speculative.p_min")

    def generation_kwargs(self) -> dict:
        if self.speculative_p_min is not None:
            raise InvalidRequest("speculative.p_min is not supported: rase's drafts per step adapt to how many held "
                                 "(bound them with speculative.n_max and speculative.n_min)", "speculative.p_min")
        out = {k: getattr(self, k) for k in ("max_tokens", "temperature", "top_p", "top_k", "min_p",
                                             "seed", "presence_penalty", "frequency_penalty", "logit_bias")
               if getattr(self, k) is not None}
        for ours, theirs in (("draft_max", self.speculative_n_max), ("draft_min", self.speculative_n_min)):
            if theirs is not None:
                out[ours] = theirs
        return out

    def structure_kwargs(self) -> dict:
        return {k: getattr(self, k) for k in ("response_format", "grammar", "regex")}


class ChatRequest(_Common):
    # max_tokens or its newer name, not both; a tool_choice other than none needs tools
    model_config = ConfigDict(extra="forbid", strict=True, json_schema_extra={"allOf": [
        _one_of("response_format", "grammar", "regex"), _one_of("max_tokens", "max_completion_tokens"),
        needs("tool_choice", "tools", unless="none"), not_with("tools", "response_format"),
        {"if": {"required": ["top_logprobs"], "properties": {"top_logprobs": {"not": {"type": "null"}}}},
         "then": {"required": ["logprobs"], "properties": {"logprobs": {"const": True}}}}]})
    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: Optional[Int] = Field(default=None, ge=1)
    tools: Optional[list[FunctionTool]] = None
    tool_choice: Optional[Union[Literal["none", "auto", "required"], dict[str, Any]]] = None
    parallel_tool_calls: Optional[bool] = None
    logprobs: Optional[bool] = None
    top_logprobs: Optional[Int] = None  # 0..20, with logprobs (checked by the engine: a 400 naming it)
    # gpt-oss's template reads it; Qwen3's enable_thinking follows it (none, minimal: off)
    reasoning_effort: Optional[Literal["none", "minimal", "low", "medium", "high"]] = None
    chat_template_kwargs: Optional[dict[str, Any]] = None  # llama-server's: more variables for the model's template
    # llama-server's: a <think> block in content (none) or in reasoning_content (deepseek, auto)
    reasoning_format: Optional[Literal["none", "deepseek", "auto"]] = None
    reasoning_budget_tokens: Optional[Int] = Field(default=None, ge=-1)  # llama-server's; -1: no limit
    thinking_budget_tokens: Optional[Int] = Field(default=None, ge=-1)   # its other name for the same

    @model_validator(mode="after")
    def _one_max_tokens(self):
        if self.max_tokens is not None and self.max_completion_tokens is not None:
            raise ValueError("give max_tokens or max_completion_tokens, not both")
        return self

    def tool_kwargs(self) -> dict:
        tools = None if self.tools is None else [t.model_dump(exclude_none=True) for t in self.tools]
        return {"tools": tools, "tool_choice": self.tool_choice, "parallel_tool_calls": self.parallel_tool_calls}

    def logprob_kwargs(self) -> dict:
        return {"logprobs": bool(self.logprobs), "top_logprobs": self.top_logprobs}


class CompletionRequest(_Common):
    # one prompt per request: text, or token ids (checked against the model's vocabulary)
    prompt: Union[str, Annotated[list[str], Field(min_length=1, max_length=1)],
                  Annotated[list[Annotated[Int, Field(ge=0)]], Field(min_length=1)]]
    logprobs: Optional[Int] = None  # 0..5 alternatives per token

    def logprob_kwargs(self) -> dict:
        return {"logprobs": self.logprobs}


class ModelRequest(BaseModel):
    """/models/load and /models/unload (llama-server's router)."""
    model_config = ConfigDict(extra="forbid", strict=True)
    model: ModelId


class TokenizeRequest(BaseModel):
    """llama-server's /tokenize, plus the model (optional when the store holds one)."""
    model_config = ConfigDict(extra="forbid", strict=True)
    model: Optional[ModelId] = None
    content: str
    add_special: bool = False
    parse_special: bool = True
    with_pieces: bool = False


class DetokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    model: Optional[ModelId] = None
    tokens: list[Annotated[Int, Field(ge=0)]]  # 5.0 is the integer 5, as JSON Schema has it


class EmbeddingsRequest(BaseModel):
    """OpenAI's /v1/embeddings (text inputs)."""
    model_config = ConfigDict(extra="forbid", strict=True)
    model: ModelId
    input: Union[Annotated[str, Field(min_length=1)], Annotated[list[Annotated[str, Field(min_length=1)]],
                                                                Field(min_length=1)]]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: Annotated[Optional[Int], Unsupported] = None  # refused: the model's own width only
    user: Optional[str] = None
