"""HTTP fuzzing: schemathesis over the server's own OpenAPI document (every route), all checks,
a fixed seed and a bounded number of examples, against a real `rase serve`. A tiny model is
registered under the ids the generator produces first ("0", "a", ...) so generated requests
reach the engine, not only the 404; max_tokens is capped to keep it quick."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from rase import QuantType
from rase.registry import ModelRegistry
from tests.conftest import rase_serve

IDS = ("0", "00", "1", "a", "A", "_", "-", "0A")
EXAMPLES = 100


def test_schemathesis_finds_no_server_error_and_no_schema_violation(tmp_path, tiny_models):
    store = tmp_path / "store"
    reg = ModelRegistry(store)
    for model_id in IDS:
        reg.import_local(model_id, tiny_models("llama", QuantType.Q8_0))
    cli = Path(sys.executable).with_name("schemathesis")
    with rase_serve(store, "--threads", "1", "--max-tokens-limit", "16", "-np", "4") as base:
        # every check but positive_data_acceptance: what makes a schema-valid body acceptable is
        # partly beyond JSON Schema (a regex, grammar or JSON schema that compiles, tool definitions,
        # token ids below this model's vocabulary, a model id the store holds) and is a 400 naming it
        out = subprocess.run([str(cli), "run", base + "/openapi.json", "--checks", "all", "--seed", "1",
                              "-n", str(EXAMPLES), "--request-timeout", "60", "--no-color",
                              "--exclude-checks", "positive_data_acceptance"],
                             capture_output=True, text=True, timeout=900, cwd=tmp_path)
    assert out.returncode == 0, out.stdout[-6000:]
    generated = sum(int(n) for n in re.findall(r"(\d+) generated", out.stdout))
    operations = re.search(r"Selected: (\d+)/(\d+)", out.stdout)
    print(f"\nschemathesis: {generated} requests generated over {operations[1]} routes, 0 failures")
    assert generated > 1000 and operations[1] == operations[2] and int(operations[1]) >= 15, out.stdout[-2000:]
