"""The Python surface: Engine (sync, streaming, async with cancellation) and the manual's
module functions."""
from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import pytest

import rase.api as api
from rase import BackendUnavailable, ModelNotFound
from rase.api import Engine

CHAT = [{"role": "user", "content": "What is the capital of France? Answer in one sentence."}]


@pytest.fixture(scope="module")
def engine(smollm2_store):
    return Engine(smollm2_store)


@pytest.mark.needs_model
def test_chat_complete_and_stream(engine):
    out = engine.chat("smollm2", CHAT, temperature=0, max_tokens=40)
    assert "Paris" in out.text and out.finish_reason == "stop" and out.prompt_tokens > 10
    assert "".join(engine.stream_chat("smollm2", CHAT, temperature=0, max_tokens=40)) == out.text
    comp = engine.complete("smollm2", "The capital of France is", temperature=0, max_tokens=3)
    assert comp.finish_reason == "length" and comp.completion_tokens == 3 and "Paris" in comp.text
    with pytest.raises(ModelNotFound):
        engine.chat("missing", CHAT)


@pytest.mark.needs_model
def test_closing_a_stream_cancels(engine):
    before = engine.stats["cancelled"]
    it = engine.stream_chat("smollm2", [{"role": "user", "content": "Tell me a long story."}],
                            temperature=0.8, max_tokens=300)
    first = [next(it) for _ in range(3)]
    it.close()
    assert all(first) and engine.stats["cancelled"] == before + 1


@pytest.mark.needs_model
def test_async_variants(engine):
    async def main():
        out = await engine.achat("smollm2", CHAT, temperature=0, max_tokens=40)
        parts = [d async for d in engine.astream_chat("smollm2", CHAT, temperature=0, max_tokens=40)]
        ticks = 0

        async def ticker():
            nonlocal ticks
            while True:
                await asyncio.sleep(0.005)
                ticks += 1

        t = asyncio.create_task(ticker())
        long = asyncio.create_task(engine.achat("smollm2", [{"role": "user", "content": "Write a long poem."}],
                                                temperature=0.8, max_tokens=300))
        await asyncio.sleep(0.5)
        long.cancel()
        with pytest.raises(asyncio.CancelledError):
            await long
        t.cancel()
        return out, parts, ticks

    before = engine.stats["cancelled"]
    out, parts, ticks = asyncio.run(main())
    assert "".join(parts) == out.text and "Paris" in out.text
    assert ticks >= 30  # the event loop kept running while the model generated
    # the cancelled task's generation stops at its next token
    for _ in range(100):
        if engine.stats["cancelled"] == before + 1:
            break
        __import__("time").sleep(0.05)
    assert engine.stats["cancelled"] == before + 1


@pytest.mark.needs_model
def test_manual_functions(tmp_path, smollm2_path):
    store = tmp_path / "store"
    toml = api.import_model(store, smollm2_path, "smollm2", chat_template="chatml")
    assert 'id = "smollm2"' in toml and 'chat_template = "chatml"' in toml
    assert api.list_models(store) == ["smollm2"]
    assert api.inspect_model(store, "smollm2") == toml
    assert api.verify_model(store, "smollm2") == toml
    text = api.generate_chat_registered_gguf(store, "smollm2", CHAT, max_tokens=40, temperature=0)
    assert "Paris" in text
    got: list[str] = []
    partial = api.generate_chat_stream_registered_gguf(store, "smollm2", CHAT,
                                                       lambda d: got.append(d) if len(got) < 2 else False,
                                                       max_tokens=40, temperature=0)
    # the third delta was delivered (the callback returned False for it) and generation stopped
    assert len(got) == 2 and partial.startswith("".join(got)) and len(partial.split()) <= 3
    comp = api.generate_registered_gguf(store, "smollm2", "The capital of France is", max_tokens=3, temperature=0)
    assert "Paris" in comp
    # a raw prompt's special-token text is those tokens (as llama-server reads it): the chat
    # template's text completed raw is the chat answer
    templated = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in CHAT) + "<|im_start|>assistant\n"
    assert api.generate_registered_gguf(store, "smollm2", templated, max_tokens=40, temperature=0) == text
    assert "Paris" in api.generate_llama_gguf(smollm2_path, None, "The capital of France is", max_tokens=3,
                                              temperature=0)
    api.unload_models()
    assert api.probe_runtime().startswith("backend=Cpu") and api.gpu_info().startswith("inactive")
    with pytest.raises(BackendUnavailable):
        api.probe_runtime("cuda")
    with pytest.raises(BackendUnavailable, match="one of"):
        api.probe_runtime("tpu")


@pytest.mark.needs_model
def test_profiling_counters(smollm2_path):
    code = (
        "import json, rase.api as api\n"
        "from rase.engine.decoder import load_gguf_decoder\n"
        f"d = load_gguf_decoder(None, {str(smollm2_path)!r})\n"
        "d.prefill([1, 2, 3, 4]); d.decode(5); d.decode(6)\n"
        "print(api.profiling_snapshot(reset=True)); print(api.profiling_snapshot())\n")
    for env, enabled in (({"RASE_PROFILE": "1"}, True), ({"RASE_PROFILE": "0"}, False)):
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             env={**__import__("os").environ, **env}, check=True).stdout.splitlines()
        first, second = json.loads(out[0]), json.loads(out[1])
        assert list(first)[:4] == ["enabled", "prefill_calls", "prefill_tokens", "prefill_forward_ns"]
        assert first["enabled"] is enabled
        if enabled:
            assert first["prefill_calls"] == 1 and first["prefill_tokens"] == 4 and first["decode_steps"] == 2
            assert first["gemm_matmul_ns"] > 0 and first["decode_matvec_ns"] > 0 and first["decode_attn_ns"] > 0
            assert second["decode_steps"] == 0  # reset after reading
        else:
            assert first["prefill_calls"] == 0 and first["decode_steps"] == 0


def test_manual_names_are_top_level_and_import_stays_light():
    import rase

    assert rase.Engine is api.Engine and rase.generate_chat_registered_gguf is api.generate_chat_registered_gguf
    from rase.engine.decoder import load_gguf_decoder

    assert rase.load_gguf_decoder is load_gguf_decoder  # the single-stream scorer outside harnesses use
    assert set(rase._API) <= set(rase.__all__)
    with pytest.raises(AttributeError):
        rase.no_such_thing  # noqa: B018
    probe = "import sys, rase; print(sorted(m for m in ('rase.api', 'tokenizers', 'jinja2') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "[]", out.stderr


@pytest.mark.needs_model
def test_special_token_text_in_a_completion_prompt(engine):
    prompt = engine.session("smollm2").chat_prompt(CHAT)
    assert "<|im_start|>" in prompt
    raw = engine.complete("smollm2", prompt, max_tokens=24, temperature=0)
    assert raw.text == engine.chat("smollm2", CHAT, max_tokens=24, temperature=0).text
    assert raw.prompt_tokens == len(engine.tokenize("smollm2", prompt, add_special=True, parse_special=True))
    plain = engine.complete("smollm2", prompt, max_tokens=1, temperature=0, parse_special=False)
    assert plain.prompt_tokens > raw.prompt_tokens + 10  # each <|im_...|> as several text tokens


@pytest.mark.needs_model
def test_engine_context_size(engine):
    from rase import ContextOverflow, InvalidRequest

    for bad in (0, -1, 2.5, True):
        with pytest.raises(InvalidRequest, match="n_ctx"):
            Engine(engine.registry.root, n_ctx=bad)
    small = Engine(engine.registry.root, n_ctx=64)
    assert small.session("smollm2").plan.n_ctx == 64 and engine.session("smollm2").plan.n_ctx == 8192
    with pytest.raises(ContextOverflow, match="context of 64"):
        small.chat("smollm2", CHAT, max_tokens=40)


@pytest.mark.needs_model
def test_tokenize_and_detokenize(engine):
    ids = engine.tokenize("smollm2", "The capital of France")
    assert ids and engine.detokenize("smollm2", ids) == "The capital of France"
    pieces = engine.tokenize("smollm2", "The capital", with_pieces=True)
    assert [i for i, _ in pieces] == engine.tokenize("smollm2", "The capital")
    assert b"".join(p for _, p in pieces) == b"The capital"
    assert engine.tokenize("smollm2", "<|im_end|>") == [2]
    assert 2 not in engine.tokenize("smollm2", "<|im_end|>", parse_special=False)
    from rase import InvalidRequest

    with pytest.raises(InvalidRequest):
        engine.detokenize("smollm2", [-1])


def test_top_k_none_is_the_whole_vocabulary():
    from rase.session.submission import generation_config as _config

    assert _config({"top_k": None}).top_k is None and _config({}).top_k == 40
    assert _config({"temperature": None}).temperature == 0.7  # other Nones: the default


@pytest.mark.needs_model
def test_one_frozen_config_reaches_every_session_and_worker(smollm2_store):
    """Engine's settings are validated once into an EngineConfig, which its sessions and
    workers receive as it is; nothing downstream can change it."""
    import dataclasses

    from rase import InvalidRequest

    with Engine(smollm2_store, max_batch=3, kv_type="q8_0", speculative="ngram", keep_alive="5m") as e:
        worker = e.session("smollm2").worker
        assert worker.config is e.config and e.config.keep_alive_s == 300.0
        assert worker.max_batch == 3 and worker.kv_type == "q8_0" and worker.drafter is not None
        with pytest.raises(dataclasses.FrozenInstanceError):
            e.config.max_batch = 4
    for bad in (dict(max_batch=0), dict(kv_type="q5"), dict(speculative="draft:"), dict(keep_alive="soon")):
        with pytest.raises(InvalidRequest):
            Engine(smollm2_store, **bad)
