"""Moving means of measured times: the scheduler's step costs, a draft model's step."""
from __future__ import annotations


class Ema:
    """A moving mean (None until the first value)."""

    def __init__(self, alpha: float = 0.2) -> None:
        self.alpha, self.value = alpha, None

    def add(self, x: float) -> None:
        self.value = x if self.value is None else self.value + self.alpha * (x - self.value)
