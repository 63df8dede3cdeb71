"""What `rase serve` sets for every request that does not say otherwise: llama-server's
--reasoning-format (--reasoning-budget is the Engine's, so it can tell a <think> model from
gpt-oss)."""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import InvalidRequest
from ..text.thinking import REASONING_FORMATS


@dataclass(frozen=True)
class ServeDefaults:
    reasoning_format: str = "auto"  # none: <think> blocks stay in content; deepseek/auto: reasoning_content

    def __post_init__(self) -> None:
        if self.reasoning_format not in REASONING_FORMATS:
            raise InvalidRequest(f"reasoning format must be one of {', '.join(REASONING_FORMATS)}, got "
                                 f"{self.reasoning_format!r}", "reasoning_format")

    def think(self, reasoning_format: str | None) -> str:
        """The engine's think mode for a request's reasoning_format (or this server's)."""
        return REASONING_FORMATS[reasoning_format or self.reasoning_format]


def budget(*asked: int | None) -> int | None:
    """The first budget a request gives (-1: none, as llama-server's); None: the engine's."""
    return next((b for b in asked if b is not None), None)
