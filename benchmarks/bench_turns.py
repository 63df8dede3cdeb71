"""A conversation's later turns on one GGUF: how much of each prompt comes from the cache and how
soon its first token comes, warm (the engine that served the turns before) against cold (no
prefix cache), for rase and, beside it, llama-server on the same file, ids and thread count.

    python benchmarks/bench_turns.py MODEL.gguf [--history 2000] [--turns 8] [--threads 2]
        [--llama-server PATH]

The conversation is token ids (a random history, then each turn the previous answer and a few new
ids), sent as token prompts to both servers, so re-tokenizing an answer changes nothing. Time to
first token, with nothing else in flight: rase's `timings.ttft_ms` (submission to the first token)
and llama-server's `timings.prompt_ms` (its prompt's processing: less than its time to first
token, so the comparison does not favour rase). A hybrid (Qwen3.5, LFM2) is where
this matters: llama.cpp cuts a recurrent state back only to its few context checkpoints.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rase.api import Engine  # noqa: E402
from rase.store.registry import ModelRegistry  # noqa: E402

ANSWER, NEW = 16, 24  # tokens generated per turn; new ids each turn adds


def _conversation(vocab: int, history: int, turns: int, seed: int = 0) -> tuple[list[int], list[list[int]]]:
    rng = np.random.default_rng(seed)
    ids = lambda n: [int(t) for t in rng.integers(3, vocab, n)]  # noqa: E731
    return ids(history), [ids(NEW) for _ in range(turns)]


def rase_turns(path: Path, history: list[int], news: list[list[int]], threads: int) -> list[dict]:
    root = Path(tempfile.mkdtemp())
    ModelRegistry(root).import_local("m", path)
    out, ids = [], list(history)
    with Engine(root, n_ctx=8192, n_threads=threads) as warm, \
            Engine(root, n_ctx=8192, n_threads=threads, prefix_cache=False) as cold:
        for new in news:
            ids = ids + new
            w = warm.complete("m", ids, temperature=0.0, max_tokens=ANSWER, logprobs=0)  # logprobs: the ids
            c = cold.complete("m", ids, temperature=0.0, max_tokens=ANSWER)
            assert w.text == c.text, "a cache hit changed the answer"
            out.append(dict(prompt=len(ids), cached=w.cached_tokens, warm_ms=w.timings["ttft_ms"],
                            cold_ms=c.timings["ttft_ms"]))
            ids = ids + [t.token for t in w.logprobs]
    return out


def _post(url: str, body: dict) -> dict:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.loads(r.read())


def llama_server_turns(binary: str, path: Path, history: list[int], news: list[list[int]], threads: int,
                       port: int = 18931) -> list[dict]:
    proc = subprocess.Popen([binary, "-m", str(path), "-t", str(threads), "-c", "8192", "--port", str(port),
                             "-np", "1"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            try:
                urllib.request.urlopen(base + "/health", timeout=1)
                break
            except OSError:
                time.sleep(0.1)
        out, ids = [], list(history)
        for new in news:
            ids = ids + new
            body = dict(prompt=ids, n_predict=ANSWER, temperature=0.0, cache_prompt=True, return_tokens=True)
            c = _post(base + "/completion", {**body, "cache_prompt": False})
            _post(base + "/completion", {**body, "prompt": ids[:-len(new)], "n_predict": 0})  # the slot: last turn
            w = _post(base + "/completion", body)
            out.append(dict(prompt=len(ids), cached=w["timings"].get("cache_n", len(ids) - w["timings"]["prompt_n"]),
                            warm_ms=w["timings"]["prompt_ms"], cold_ms=c["timings"]["prompt_ms"]))
            ids = ids + w["tokens"]
        return out
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _table(name: str, rows: list[dict], previous: list[int]) -> None:
    print(f"\n{name}")
    print("turn  prompt  cached  cached/prev   warm ms   cold ms   cold/warm")
    for i, (r, prev) in enumerate(zip(rows, previous)):
        print(f"{i + 1:4d}  {r['prompt']:6d}  {r['cached']:6d}  {r['cached'] / prev:10.3f}  {r['warm_ms']:8.1f}  "
              f"{r['cold_ms']:8.1f}  {r['cold_ms'] / max(r['warm_ms'], 1e-3):9.1f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", type=Path)
    ap.add_argument("--history", type=int, default=2000)
    ap.add_argument("--turns", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--llama-server")
    args = ap.parse_args()
    from rase.store.gguf import GGUFFile

    vocab = int(GGUFFile(args.model).tensor("token_embd.weight").ne[1])
    history, news = _conversation(vocab, args.history, args.turns)
    rows = rase_turns(args.model, history, news, args.threads)
    prev = [len(history)] + [r["prompt"] + ANSWER - 1 for r in rows[:-1]]  # what the turn before computed
    _table(f"rase, {args.model.name}, {args.threads} threads", rows, prev)
    if args.llama_server:
        _table("llama-server", llama_server_turns(args.llama_server, args.model, history, news, args.threads), prev)


if __name__ == "__main__":
    main()
