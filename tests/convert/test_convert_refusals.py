"""What `rase model convert` refuses, and that a refusal or a failure leaves the store as it was:
no manifest, no blob, no temporary file. Pickle weights are refused unread, naming the file and
the safe way to convert it; an architecture, tokenizer, dtype or tensor rase cannot place is
refused before anything is written; a shard that turns out short mid-write leaves nothing."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rase import (CorruptModelFile, StoreWriteError, TokenizerError, UnsafeCheckpoint, UnsupportedArchitecture,
                  UnsupportedFormat, UnsupportedQuantType, convert_model)
from tests.support.hf_checkpoints import save_safetensors, write_checkpoint


def _store_files(store: Path) -> list[str]:
    return sorted(str(p.relative_to(store)) for p in store.rglob("*") if p.is_file()) if store.exists() else []


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory) -> Path:
    return write_checkpoint(tmp_path_factory.mktemp("hf") / "qwen3", "qwen3")


def _copy(src: Path, dst: Path) -> Path:
    dst.mkdir()
    for f in src.iterdir():
        (dst / f.name).write_bytes(f.read_bytes())
    return dst


def test_pickle_weights_are_refused_unread_with_the_command_that_converts_them(tmp_path):
    folder = tmp_path / "pickled"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    # a pickle that would write a file if it were ever unpickled
    marker = tmp_path / "unpickled"
    payload = f"cos\nsystem\n(S'touch {marker}'\ntR."
    (folder / "pytorch_model.bin").write_bytes(payload.encode())
    with pytest.raises(UnsafeCheckpoint) as exc:
        convert_model(folder, "m", "Q8_0", store=tmp_path / "store")
    msg = str(exc.value)
    assert "pytorch_model.bin" in msg and "runs code" in msg
    assert "save_pretrained" in msg and "safe_serialization=True" in msg and str(folder) in msg
    assert not marker.exists()
    assert _store_files(tmp_path / "store") == []


def test_the_cli_refuses_it_in_one_line_and_exit_code_1(tmp_path):
    folder = tmp_path / "pickled"
    folder.mkdir()
    (folder / "model.pt").write_bytes(b"\x80\x04K\x01.")
    out = subprocess.run([sys.executable, "-m", "rase", "model", "convert", str(folder), "--id", "m", "--store",
                          str(tmp_path / "store")], capture_output=True, text=True)
    assert out.returncode == 1
    assert out.stderr.startswith("error: ") and "model.pt" in out.stderr and len(out.stderr.splitlines()) == 1
    assert _store_files(tmp_path / "store") == []


@pytest.mark.parametrize("change,error,words", [
    (lambda c: c.update(architectures=["PhiForCausalLM"]), UnsupportedArchitecture, "PhiForCausalLM"),
    (lambda c: c.update(architectures=None), UnsupportedArchitecture, "None"),
    (lambda c: c.update(rope_scaling={"rope_type": "dynamic", "factor": 2.0}), UnsupportedArchitecture, "dynamic"),
    (lambda c: c.update(use_sliding_window=True), UnsupportedArchitecture, "use_sliding_window"),
])
def test_what_a_gguf_cannot_say_is_refused_before_anything_is_written(qwen3, tmp_path, change, error, words):
    folder = _copy(qwen3, tmp_path / "ckpt")
    cfg = json.loads((folder / "config.json").read_text())
    change(cfg)
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(error, match=words):
        convert_model(folder, "m", "Q4_K_M", store=tmp_path / "store")
    assert _store_files(tmp_path / "store") == []


def test_moe_without_renormalized_routing_is_refused(tmp_path):
    folder = write_checkpoint(tmp_path / "moe", "qwen3moe")
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(cfg | {"norm_topk_prob": False}))
    with pytest.raises(UnsupportedArchitecture, match="norm_topk_prob"):
        convert_model(folder, "m", "Q8_0", store=tmp_path / "store")


def _resharded(src: Path, dst: Path, change) -> Path:
    """src's checkpoint with its weights changed by change(dict), in one shard without an index."""
    from tests.support.hf_checkpoints import load_checkpoint

    folder = _copy(src, dst)
    for f in [*folder.glob("*.safetensors"), folder / "model.safetensors.index.json"]:
        f.unlink()
    _, weights = load_checkpoint(src)
    change(weights)
    save_safetensors(folder / "model.safetensors", weights, "F32")
    return folder


def test_a_tensor_with_no_place_and_a_missing_one_are_refused(qwen3, tmp_path):
    extra = _resharded(qwen3, tmp_path / "extra", lambda w: w.update({"model.layers.0.mlp.mystery.weight": [[1.0] * 4]}))
    with pytest.raises(UnsupportedArchitecture, match="model.layers.0.mlp.mystery.weight"):
        convert_model(extra, "m", "Q8_0", store=tmp_path / "store")
    missing = _resharded(qwen3, tmp_path / "missing", lambda w: w.pop("model.layers.1.mlp.up_proj.weight"))
    with pytest.raises(UnsupportedArchitecture, match="lacks model.layers.1.mlp.up_proj.weight"):
        convert_model(missing, "m", "Q8_0", store=tmp_path / "store")
    assert _store_files(tmp_path / "store") == []


def _raw_shard(path: Path, header: dict, data: bytes) -> None:
    head = json.dumps(header).encode()
    path.write_bytes(len(head).to_bytes(8, "little") + head + data)


def test_unsupported_dtype_tokenizer_and_type_are_refused(qwen3, tmp_path):
    with pytest.raises(UnsupportedQuantType, match="Q2_K"):
        convert_model(qwen3, "m", "Q2_K", store=tmp_path / "store")
    folder = _copy(qwen3, tmp_path / "fp8")
    (folder / "model.safetensors.index.json").unlink()
    _raw_shard(folder / "scales.safetensors",
               {"model.layers.0.mlp.up_proj.weight_scale": {"dtype": "F8_E4M3", "shape": [4], "data_offsets": [0, 4]}},
               b"\0" * 4)
    with pytest.raises(UnsupportedFormat, match="F8_E4M3"):
        convert_model(folder, "m", "Q8_0", store=tmp_path / "store")
    folder = _copy(qwen3, tmp_path / "wordpiece")
    tok = json.loads((folder / "tokenizer.json").read_text())
    tok["model"]["type"] = "WordPiece"
    (folder / "tokenizer.json").write_text(json.dumps(tok))
    with pytest.raises(TokenizerError, match="WordPiece"):
        convert_model(folder, "m", "Q8_0", store=tmp_path / "store")
    assert _store_files(tmp_path / "store") == []


def test_a_corrupt_header_is_a_corrupt_file(qwen3, tmp_path):
    folder = _copy(qwen3, tmp_path / "corrupt")
    shard = sorted(folder.glob("*.safetensors"))[0]
    shard.write_bytes((10 ** 12).to_bytes(8, "little") + shard.read_bytes()[8:])
    with pytest.raises(CorruptModelFile, match="header length"):
        convert_model(folder, "m", "Q8_0", store=tmp_path / "store")
    _raw_shard(shard, {"x": {"dtype": "F32", "shape": [4], "data_offsets": [0, 64]}}, b"\0" * 16)
    with pytest.raises(CorruptModelFile, match="64 bytes at"):
        convert_model(folder, "m", "Q8_0", store=tmp_path / "store")


def test_a_short_shard_is_refused_before_anything_is_written(qwen3, tmp_path):
    folder = _copy(qwen3, tmp_path / "short")
    last = sorted(folder.glob("*.safetensors"))[-1]
    os.truncate(last, last.stat().st_size - 1000)
    with pytest.raises(CorruptModelFile, match="the file has"):
        convert_model(folder, "m", "Q8_0", store=tmp_path / "store")
    assert _store_files(tmp_path / "store") == []


def test_a_write_that_fails_midway_leaves_the_store_as_it_was(qwen3, tmp_path, monkeypatch):
    """The disk fills after a few bands were written: StoreWriteError; the temporary file goes,
    no blob or manifest appears, an earlier model is untouched and still verifies."""
    from rase.convert.gguf_writer import GGUFStreamWriter
    from rase.store.registry import ModelRegistry

    store = tmp_path / "store"
    convert_model(qwen3, "before", "Q8_0", store=store)
    before = _store_files(store)
    real, calls = GGUFStreamWriter.write, []

    def failing(self, data):
        calls.append(1)
        if len(calls) == 5:
            raise OSError(28, "No space left on device")
        real(self, data)

    monkeypatch.setattr(GGUFStreamWriter, "write", failing)
    with pytest.raises(StoreWriteError, match="No space left"):
        convert_model(qwen3, "after", "Q4_K_M", store=store)
    assert len(calls) == 5 and _store_files(store) == before
    assert ModelRegistry(store).verify("before").id == "before"


def test_a_full_disk_is_a_store_write_error(qwen3, tmp_path, monkeypatch):
    import shutil

    usage = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(shutil, "disk_usage", lambda p: usage._replace(free=1000))
    with pytest.raises(StoreWriteError, match="GiB"):
        convert_model(qwen3, "m", "Q8_0", store=tmp_path / "store")
    assert [p for p in _store_files(tmp_path / "store") if not p.startswith("manifests")] == []
