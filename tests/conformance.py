"""Conformance against llama.cpp's fixtures (tests/fixtures/*.llamacpp.json): teacher-forced
top-1 agreement and greedy continuations. Shared by the tests and benchmarks/conformance.py."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

FIXTURES = Path(__file__).parent / "fixtures"


def load_fixture(name: str) -> dict:
    return json.loads((FIXTURES / f"{name}.llamacpp.json").read_text())


@dataclass
class Agreement:
    positions: int = 0
    exact: int = 0        # our argmax is llama.cpp's argmax
    near: int = 0         # our argmax has a llama.cpp logit within 0.5 of llama.cpp's max
    max_logit_err: float = 0.0  # max |ours - llama.cpp| over llama.cpp's top-20 logits
    greedy_equal: int = 0
    prompts: int = 0
    details: list = field(default_factory=list)

    @property
    def exact_rate(self) -> float:
        return self.exact / max(1, self.positions)

    @property
    def near_rate(self) -> float:
        return self.near / max(1, self.positions)


def teacher_forced(decoder, fixture: dict, agreement: Agreement) -> None:
    for prompt in fixture["prompts"]:
        logits = decoder.prefill(prompt["ids"], all_logits=True)
        for i, top in enumerate(prompt["topk"]):
            ref = {int(t): float(v) for t, v in top}
            best = int(top[0][0])
            ours = int(np.argmax(logits[i]))
            agreement.positions += 1
            agreement.exact += ours == best
            agreement.near += ours in ref and ref[best] - ref[ours] <= 0.5
            err = max(abs(float(logits[i][t]) - v) for t, v in ref.items())
            agreement.max_logit_err = max(agreement.max_logit_err, err)


def greedy(decoder, ids: list[int], n: int, eos: int | None) -> list[int]:
    out: list[int] = []
    logits = decoder.prefill(ids)
    while len(out) < n:
        tok = int(np.argmax(logits))
        out.append(tok)
        if tok == eos or len(out) == n:
            break
        logits = decoder.decode(tok)
    return out


def greedy_agreement(decoder, fixture: dict, agreement: Agreement) -> None:
    for prompt in fixture["prompts"]:
        ref = prompt["greedy"]
        ours = greedy(decoder, prompt["ids"], len(ref), fixture["eos"])
        agreement.prompts += 1
        agreement.greedy_equal += ours == ref
        agreement.details.append((ours == ref, ours, ref))
