"""Coverage-guided fuzzing of the GGUF reader with atheris (libFuzzer): every input parses or
raises a RaseError; what parses has its tensors dequantized (the C kernels) and its tokenizer
built from the metadata. Anything else is a crash: libFuzzer writes the input to
-artifact_prefix and exits non-zero.

    python tests/support/fuzz_gguf.py CORPUS_DIR [-max_total_time=60] [-artifact_prefix=DIR/] [-seed=1]

tests/store/test_gguf_fuzz.py runs it time-bounded in CI; keep a crash's input in
tests/fixtures/gguf-crashes/ (it becomes a regression test there).
"""
from __future__ import annotations

import sys


def exercise(data: bytes) -> None:
    """The target: only RaseErrors may leave it."""
    from rase import RaseError, dequantize
    from rase.store.gguf import GGUFFile
    from rase.text.tokenizer import LocalTokenizer

    try:
        g = GGUFFile.from_buffer(data, "fuzz.gguf")
    except RaseError:
        return
    for t in list(g.tensors.values())[:8]:
        if t.nbytes <= 1 << 20:
            try:
                dequantize(t)
            except RaseError:
                pass
    try:
        tok = LocalTokenizer.from_gguf(g)
        tok.decode(tok.encode("Hello, world! 123"))
    except RaseError:
        pass


def seeds() -> list[bytes]:
    """Small valid files: the metadata types, three quant types, a BPE and an SPM vocabulary."""
    import struct

    import numpy as np

    from tests.support.ggufbuild import Tensor, small_spec

    rng = np.random.default_rng(1)
    base = small_spec()
    q4k = Tensor("w.q4k", (256, 1), 12, struct.pack("<ee", 0.25, 0.01) + rng.integers(0, 256, 140, np.uint8).tobytes())
    f16 = Tensor("w.f16", (8, 2), 1, np.arange(16, dtype=np.float16).tobytes())
    bpe = [("tokenizer.ggml.model", 8, "gpt2"), ("tokenizer.ggml.tokens", 9, (8, ["H", "e", "l", "o", "He", "ll"])),
           ("tokenizer.ggml.token_type", 9, (5, [1] * 6)), ("tokenizer.ggml.merges", 9, (8, ["H e", "l l"]))]
    spm = [("tokenizer.ggml.model", 8, "llama"), ("tokenizer.ggml.tokens", 9, (8, ["<unk>", "<s>", "▁H", "e"])),
           ("tokenizer.ggml.scores", 9, (6, [0.0, 0.0, -1.0, -2.0])), ("tokenizer.ggml.token_type", 9, (5, [2, 3, 1, 1]))]
    out = [base.build()]
    for kvs in (bpe, spm):
        spec = small_spec()
        spec.kvs = [kv for kv in spec.kvs if not kv[0].startswith("tokenizer.")] + kvs
        spec.tensors += [q4k, f16]
        out.append(spec.build())
    return out


def main() -> None:
    import atheris

    with atheris.instrument_imports(include=["rase"]):
        import rase.store.gguf  # noqa: F401
        import rase.kernels.quants  # noqa: F401
        import rase.text.tokenizer  # noqa: F401

    atheris.Setup(sys.argv, lambda data: exercise(bytes(data)))
    atheris.Fuzz()


if __name__ == "__main__":
    sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[2]))
    main()
