"""OpenAI request bodies (validated by pydantic; 422s are turned into OpenAI 400s).

A field the server does not implement is a 400 that names it, never silently dropped: bodies
forbid unknown keys, and message fields rase does not render must be absent or null.
"""
from __future__ import annotations

from typing import Annotated, Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema, field_validator, model_validator

from ..chat import message_text
from ..errors import InvalidRequest


# a registered model id (rase.registry's rule), stated in the OpenAPI document
MODEL_ID_PATTERN = r"^[A-Za-z0-9_-]+$"
ModelId = Annotated[str, Field(pattern=MODEL_ID_PATTERN, description="a model id from /v1/models")]

# a field clients may send only as null or not at all (the server refuses any value by name)
Unsupported = WithJsonSchema({"type": "null", "description": "not supported: null or absent"})

# what clients echo back from a response message (null for a plain answer)
_NULL_MESSAGE_FIELDS = ("refusal", "function_call", "audio", "annotations")


class Message(BaseModel):
    # content is required, except (null or absent) in an assistant's tool-call message
    model_config = ConfigDict(extra="forbid", strict=True, json_schema_extra={"allOf": [
        {"anyOf": [{"required": ["content"], "properties": {"content": {"type": "string"}}},
                   {"required": ["role", "tool_calls"],
                    "properties": {"role": {"const": "assistant"}, "tool_calls": {"type": "array", "minItems": 1}}}]}]})
    role: str
    content: Optional[str] = None               # null only for an assistant's tool calls
    name: Optional[str] = None                  # the speaker (a tool result's: its function), passed to the template
    tool_calls: Optional[list[dict[str, Any]]] = None
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
            value = {k: v for k, v in value.items() if k not in _NULL_MESSAGE_FIELDS}
        return value

    @field_validator("content", mode="before")
    @classmethod
    def _text_parts(cls, value):
        if value is None:
            return None
        try:
            return message_text(value)
        except InvalidRequest as exc:
            raise ValueError(str(exc)) from None


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    include_usage: bool = False


class _Common(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    model: ModelId
    max_tokens: Optional[int] = Field(default=None, ge=1)
    temperature: Optional[float] = Field(default=None, ge=0.0, le=5.0)
    top_p: Optional[float] = Field(default=None, gt=0.0, le=1.0)
    top_k: Optional[int] = Field(default=None, ge=1)
    min_p: Optional[float] = Field(default=None, ge=0.0, le=1.0)
    seed: Optional[int] = Field(default=None, ge=0)
    stop: Optional[Union[str, list[str]]] = None
    stream: bool = False
    stream_options: Optional[StreamOptions] = None
    presence_penalty: Optional[float] = Field(default=None, ge=-2.0, le=2.0)
    frequency_penalty: Optional[float] = Field(default=None, ge=-2.0, le=2.0)
    n: int = Field(default=1, ge=1, le=8)  # choices; the prompt is computed once
    user: Optional[str] = None  # the caller's end-user id: accepted, recorded nowhere
    logit_bias: Optional[dict[str, float]] = None
    response_format: Optional[dict[str, Any]] = None
    grammar: Optional[Annotated[str, Field(min_length=1)]] = None  # extension (llama-server's): Lark or GBNF
    regex: Optional[Annotated[str, Field(min_length=1)]] = None    # extension: a regex the whole output matches

    def generation_kwargs(self) -> dict:
        return {k: getattr(self, k) for k in ("max_tokens", "temperature", "top_p", "top_k", "min_p",
                                              "seed", "presence_penalty", "frequency_penalty", "logit_bias")
                if getattr(self, k) is not None}

    def structure_kwargs(self) -> dict:
        return {k: getattr(self, k) for k in ("response_format", "grammar", "regex")}


class ChatRequest(_Common):
    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: Optional[int] = Field(default=None, ge=1)
    tools: Optional[list[Any]] = None
    tool_choice: Optional[Union[str, dict[str, Any]]] = None
    parallel_tool_calls: Optional[bool] = None
    logprobs: Optional[bool] = None
    top_logprobs: Optional[int] = None  # 0..20, with logprobs (checked by the engine: a 400 naming it)
    # gpt-oss's template reads it; Qwen3's enable_thinking follows it (none, minimal: off)
    reasoning_effort: Optional[Literal["none", "minimal", "low", "medium", "high"]] = None
    chat_template_kwargs: Optional[dict[str, Any]] = None  # llama-server's: more variables for the model's template
    # llama-server's: a <think> block in content (none) or in reasoning_content (deepseek, auto)
    reasoning_format: Optional[Literal["none", "deepseek", "auto"]] = None
    reasoning_budget_tokens: Optional[int] = Field(default=None, ge=-1)  # llama-server's; -1: no limit
    thinking_budget_tokens: Optional[int] = Field(default=None, ge=-1)   # its other name for the same

    def tool_kwargs(self) -> dict:
        return {k: getattr(self, k) for k in ("tools", "tool_choice", "parallel_tool_calls")}

    def logprob_kwargs(self) -> dict:
        return {"logprobs": bool(self.logprobs), "top_logprobs": self.top_logprobs}


class CompletionRequest(_Common):
    # one prompt per request: text, or token ids (checked against the model's vocabulary)
    prompt: Union[str, Annotated[list[str], Field(min_length=1, max_length=1)], Annotated[list[int], Field(min_length=1)]]
    logprobs: Optional[int] = None  # 0..5 alternatives per token

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
    tokens: list[Annotated[int, Field(ge=0)]]


class EmbeddingsRequest(BaseModel):
    """OpenAI's /v1/embeddings (text inputs)."""
    model_config = ConfigDict(extra="forbid", strict=True)
    model: ModelId
    input: Union[Annotated[str, Field(min_length=1)], Annotated[list[Annotated[str, Field(min_length=1)]],
                                                                Field(min_length=1)]]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: Annotated[Optional[int], Unsupported] = None  # refused: the model's own width only
    user: Optional[str] = None
