"""Conformance against llama.cpp's fixtures (tests/fixtures/*.llamacpp*.json): teacher-forced
logits and greedy continuations. `-t1` fixtures hold llama.cpp's one-token (n_batch = 1)
numerics, which rase reproduces exactly; the batched ones hold llama.cpp's batched rounding
(batch-dependent), checked within tolerances. Shared by the tests and benchmarks."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

FIXTURES = Path(__file__).parents[1] / "fixtures"


def llamacpp_order(model) -> bool:
    """No matrix of a block-sum type (rase/kernels/_repack_bs.h): every kernel the model runs has
    llama.cpp's one-token order, so its results are llama.cpp's t1 results exactly. model:
    anything holding the file's .gguf (a GGUFDecoder, a ModelPlan)."""
    from rase.kernels import _kernels

    block_sum = set(_kernels.block_sum_types())
    return not any(int(t.qtype) in block_sum for t in model.gguf.tensors.values())


def load_fixture(name: str, t1: bool = False) -> dict:
    return json.loads((FIXTURES / f"{name}.llamacpp{'-t1' if t1 else ''}.json").read_text())


@dataclass
class Agreement:
    positions: int = 0
    exact: int = 0        # our argmax is llama.cpp's argmax
    near: int = 0         # our argmax has a llama.cpp logit within 0.5 of llama.cpp's max
    max_logit_err: float = 0.0    # max |ours - llama.cpp| over llama.cpp's top-20 logits
    max_rounded_err: float = 0.0  # the same with ours rounded to the fixture's 4 decimals
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
            rounded = max(abs(round(float(logits[i][t]), 4) - v) for t, v in ref.items())
            agreement.max_logit_err = max(agreement.max_logit_err, err)
            agreement.max_rounded_err = max(agreement.max_rounded_err, rounded)


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
