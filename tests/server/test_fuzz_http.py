"""HTTP fuzzing: schemathesis over the server's own OpenAPI document (every route), every check
(--checks all, schema-valid requests must be accepted too), seed 7 and a bounded number of
examples, against a real `rase serve`. A tiny model is registered under the ids the generator
produces first ("0", "a", ...) so generated requests reach the engine, not only the 404; it has
byte tokens and a 4096 context as real models do; max_tokens is capped to keep it quick. The
hooks (tests/support/schemathesis_hooks.py) give schema-valid cases valid programs where a field holds
one (a grammar, a JSON schema), distinct tool names and real images: what JSON Schema cannot state.
The model has a (tiny Gemma 3) vision encoder, so image parts are served, not refused."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from rase import QuantType
from rase.store.registry import ModelRegistry
from tests.support.servers import rase_serve
from tests.support.tinymodels import write_tiny_model

IDS = ("0", "00", "1", "a", "A", "_", "-", "0A")
EXAMPLES = 100


def test_schemathesis_finds_no_server_error_and_no_schema_violation(tmp_path):
    store = tmp_path / "store"
    reg = ModelRegistry(store)
    model = write_tiny_model(tmp_path / "fuzz.gguf", "llama", QuantType.Q8_0, hp={"n_vocab": 512, "n_ctx": 4096},
                             extra_tokens={f"<0x{b:02X}>": 6 for b in range(256)})
    mmproj = Path(__file__).resolve().parents[1] / "fixtures" / "vision" / "gemma3-tiny-mmproj.gguf"
    for model_id in IDS:
        reg.import_local(model_id, model)
        reg.attach_mmproj(model_id, mmproj)  # image parts reach the encoder too
    cli = Path(sys.executable).with_name("schemathesis")
    env = {**os.environ, "SCHEMATHESIS_HOOKS": "tests.support.schemathesis_hooks",
           "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[2]), os.environ.get("PYTHONPATH", "")])}
    with rase_serve(store, "--threads", "1", "--max-tokens-limit", "16", "-np", "4") as base:
        out = subprocess.run([str(cli), "run", base + "/openapi.json", "--checks", "all", "--seed", "7",
                              "-n", str(EXAMPLES), "--request-timeout", "60", "--no-color"],
                             capture_output=True, text=True, timeout=900, cwd=tmp_path, env=env)
    assert out.returncode == 0, out.stdout[-6000:]
    generated = sum(int(n) for n in re.findall(r"(\d+) generated", out.stdout))
    operations = re.search(r"Selected: (\d+)/(\d+)", out.stdout)
    print(f"\nschemathesis: {generated} requests generated over {operations[1]} routes, 0 failures")
    assert generated > 1000 and operations[1] == operations[2] and int(operations[1]) >= 15, out.stdout[-2000:]
