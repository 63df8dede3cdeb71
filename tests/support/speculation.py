"""A mixed batch of requests for the speculation tests: greedy, seeded-sampled, with a logit_bias
and with penalties, all submitted together (the same tokens with and without drafts)."""
from __future__ import annotations

from rase.api import Engine

PROMPTS = ["a b c d a b c d a b c", "xyz xyz xyz xyz", "hello there hello there hello", "one two three"]


def run_prompts(store, speculative):
    """Every prompt greedy and seeded-sampled, all submitted together, and with a logit_bias and
    penalties (each draft row's sampler counts the drafts before it)."""
    with Engine(store, speculative=speculative, n_threads=2, max_batch=16) as e:
        handles = [e.submit_complete("m", p, max_tokens=24, temperature=0) for p in PROMPTS]
        handles.append(e.submit_complete("m", PROMPTS[0], max_tokens=24, temperature=0, logit_bias={"5": 2.0}))
        handles.append(e.submit_complete("m", PROMPTS[1], max_tokens=24, temperature=0.8, seed=9, repeat_penalty=1.3,
                                         presence_penalty=0.4, frequency_penalty=0.2))
        noise = [e.submit_complete("m", p, max_tokens=24, temperature=0.9, top_k=8, seed=s)
                 for s, p in enumerate(PROMPTS)]
        greedy = [h.result() for h in handles]
        sampled = [h.result().text for h in noise]
        stats = e.stats["models"]["m"]
    return [g.text for g in greedy], sampled, stats
