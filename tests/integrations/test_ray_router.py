"""PrefixAffinityRouter's bookkeeping without a Ray instance: Ray's routing tasks call
choose_replicas for a whole burst before the first request is sent (seen in a real burst: 8 and
10 choices in a row, then the sends), so a replica's load must count choices, not sends alone."""
from __future__ import annotations

import asyncio
from types import SimpleNamespace

from ray.serve._private.common import DeploymentHandleSource, DeploymentID, ReplicaID

from rase.integrations import ray_router
from rase.integrations.ray_router import PrefixAffinityRouter
from rase.integrations.route_key import rendezvous_order

DEPLOYMENT = DeploymentID(name="RaseReplica", app_name="rase")


def _router(imbalance: int) -> PrefixAffinityRouter:
    router = PrefixAffinityRouter(deployment_id=DEPLOYMENT, handle_source=DeploymentHandleSource.UNKNOWN)
    router.initialize_state(imbalance=imbalance)
    return router


def _replicas(*names: str) -> list:
    return [SimpleNamespace(replica_id=ReplicaID(unique_id=n, deployment_id=DEPLOYMENT)) for n in names]


def _request(i: int, key: str | None = "one key") -> SimpleNamespace:
    return SimpleNamespace(args=[SimpleNamespace(route_key=key)],
                           metadata=SimpleNamespace(internal_request_id=f"req-{i}"))


def _first(router, replicas, request) -> str:
    return asyncio.run(router.choose_replicas(replicas, request))[0][0].replica_id.unique_id


def test_a_burst_chosen_before_any_send_spills_past_the_imbalance():
    router, replicas = _router(imbalance=2), _replicas("a", "b")
    home = ["a", "b"][rendezvous_order("one key", ["a", "b"])[0]]
    firsts = [_first(router, replicas, _request(i)) for i in range(12)]
    assert firsts[:3] == [home] * 3  # 3 on the key's replica before it is more than 2 ahead
    assert firsts.count(home) == 7 and len(set(firsts)) == 2, firsts  # then within 2 of the other


def test_a_choice_counts_once_until_its_request_completes():
    router, replicas = _router(imbalance=0), _replicas("a", "b")
    home = _first(router, replicas, _request(0))
    assert _first(router, replicas, _request(0)) == home  # chosen again (ranks were full): not counted twice
    router.on_send_request(ReplicaID(unique_id=home, deployment_id=DEPLOYMENT))
    assert sum(router._load(replicas)) == 1  # sent: counted in flight, its choice gone
    other = _first(router, replicas, _request(1))
    assert other != home
    router.on_request_completed(ReplicaID(unique_id=other, deployment_id=DEPLOYMENT), "req-1")  # never sent
    router.on_request_completed(ReplicaID(unique_id=home, deployment_id=DEPLOYMENT), "req-0")
    assert router._load(replicas) == [0, 0] and not router.chosen


def test_a_choice_never_sent_expires(monkeypatch):
    router, replicas = _router(imbalance=8), _replicas("a", "b")
    clock = [100.0]
    monkeypatch.setattr(ray_router.time, "monotonic", lambda: clock[0])
    _first(router, replicas, _request(0))  # its client left before Ray sent it: no hook follows
    assert sum(router._load(replicas)) == 1
    clock[0] += ray_router.CHOICE_TTL_S
    assert router._load(replicas) == [0, 0]


def test_keyless_requests_go_to_the_least_loaded_counting_choices():
    router, replicas = _router(imbalance=8), _replicas("a", "b", "c")
    firsts = [_first(router, replicas, _request(i, key=None)) for i in range(6)]
    assert sorted(firsts) == ["a", "a", "b", "b", "c", "c"]
