"""How many rase replicas a Ray Serve deployment runs: `rase serve --ray --replicas`, a config
file's replicas (ray_serve.app_builder). A module of its own, so the command (ray_run.py, which
imports Ray only after setting how a local Ray binds) and the deployment (ray_serve.py) share it
without importing each other."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import InvalidRequest


@dataclass(frozen=True)
class Replicas:
    """How many replicas: a fixed count, or autoscaling between low and high with Ray's
    autoscaler aiming at target_ongoing requests per replica."""
    count: int = 1
    low: int | None = None
    high: int | None = None
    target_ongoing: float | None = None

    @staticmethod
    def parse(text: str) -> "Replicas":
        """'2' -> 2 replicas; '1:4' -> autoscaling between 1 and 4 (--replicas, a config's replicas)."""
        low, sep, high = text.partition(":")
        if not (low.isdigit() and (not sep or high.isdigit())) or int(low) < 1 or (sep and int(high) < int(low)):
            raise InvalidRequest(f"--replicas {text}: give a count (2) or a range to autoscale in (1:4)",
                                          "replicas")
        return Replicas(low=int(low), high=int(high)) if sep else Replicas(int(low))

    def describe(self) -> str:
        return f"{self.count} rase replica(s)" if self.high is None else f"{self.low} to {self.high} rase replicas"

    def options(self, max_batch: int) -> dict[str, Any]:
        if self.high is None:
            return {"num_replicas": self.count}
        return {"autoscaling_config": {"min_replicas": self.low, "max_replicas": self.high,
                                       "target_ongoing_requests": self.target_ongoing or max_batch}}
