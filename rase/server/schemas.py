"""OpenAI request bodies (validated by pydantic; 422s are turned into OpenAI 400s)."""
from __future__ import annotations

from typing import Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, field_validator

from ..chat import message_text
from ..errors import InvalidGenerationConfig


class Message(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: str
    content: str

    @field_validator("content", mode="before")
    @classmethod
    def _text_parts(cls, value):
        try:
            return message_text(value)
        except InvalidGenerationConfig as exc:
            raise ValueError(str(exc)) from None


class StreamOptions(BaseModel):
    include_usage: bool = False


class _Common(BaseModel):
    model_config = ConfigDict(extra="ignore")
    model: str
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
    n: int = Field(default=1, ge=1, le=1)

    def generation_kwargs(self) -> dict:
        return {k: getattr(self, k) for k in ("max_tokens", "temperature", "top_p", "top_k", "min_p",
                                              "seed", "presence_penalty", "frequency_penalty")
                if getattr(self, k) is not None}


class ChatRequest(_Common):
    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: Optional[int] = Field(default=None, ge=1)


class CompletionRequest(_Common):
    prompt: Union[str, list[str]]
