"""tests/fixtures/convert.llamacpp-t1.json: llama.cpp's one-token logits on the files `rase model
convert` makes from tests/support/hf_checkpoints.py's tiny checkpoints (seed 0), per family and file type:
the SHA-256 of the float32 logits (positions x 512 vocabulary) of tests/support/hf_checkpoints.py's TOKENS
evaluated one token per batch, the top token at each position, the largest |logit|.

Run with the portable AVX2 llama-cpp-python 0.3.36 (../shared/wheels; the build the other t1
fixtures come from) first on the path, e.g.
  pip install --no-deps --target /tmp/lcpw llama_cpp_python-0.3.36-py3-none-linux_x86_64.whl
  PYTHONPATH=/tmp/lcpw python benchmarks/convert_fixture.py
"""
from __future__ import annotations

import hashlib
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
TYPES = ("F32", "F16", "BF16", "Q8_0", "Q6_K", "Q4_K_M", "Q4_0")


def main() -> None:
    import llama_cpp

    from rase import convert_model
    from tests.support.hf_checkpoints import KINDS, write_checkpoint
    from tests.support.hf_checkpoints import TOKENS

    out = {"llama_cpp_python": llama_cpp.__version__, "system": llama_cpp.llama_print_system_info().decode(),
           "tokens": TOKENS, "files": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for kind in KINDS:
            folder = write_checkpoint(Path(tmp) / kind, kind)
            for qtype in TYPES:
                m = convert_model(folder, f"{kind}-{qtype.lower()}", qtype, store=Path(tmp) / "store")
                llm = llama_cpp.Llama(model_path=str(m.weights), n_ctx=64, n_batch=1, n_ubatch=1, logits_all=True,
                                      n_threads=1, verbose=False)
                for t in TOKENS:
                    llm.eval([t])
                logits = np.array([llm.scores[i] for i in range(len(TOKENS))], np.float32)
                llm.close()
                out["files"][f"{kind}-{qtype}"] = {"sha256": hashlib.sha256(logits.tobytes()).hexdigest(),
                                                   "top1": logits.argmax(-1).tolist(),
                                                   "max_abs": float(np.abs(logits).max())}
                print(kind, qtype, out["files"][f"{kind}-{qtype}"]["sha256"][:16], flush=True)
    (ROOT / "tests" / "fixtures" / "convert.llamacpp-t1.json").write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
