"""Ray Serve request router for rase replicas: a request with a route key goes to the replica
its key hashes to (rendezvous hashing over the running replicas), so its prompt prefix meets the
prefix cache that holds it; when that replica has more than `imbalance` requests over the least
loaded one, or no key, the least loaded replica takes it (Ray's queue-length probes decide).

Hashing needs no shared state: every ingress replica and every node picks the same replica for
a key, and a replica that dies moves only the keys it held."""
from __future__ import annotations

import random
from typing import List, Optional

from ray.serve.request_router import FIFOMixin, PendingRequest, RequestRouter, RunningReplica

from .route_key import rendezvous_order


def _key_of(pending: Optional[PendingRequest]) -> str | None:
    if pending is None or not pending.args:
        return None
    return getattr(pending.args[0], "route_key", None)


def _least_loaded(replicas: List[RunningReplica]) -> List[List[RunningReplica]]:
    """One rank: Ray takes the shortest queue in it, the first on a tie, so shuffle the ties away."""
    return [random.sample(replicas, len(replicas))]


class PrefixAffinityRouter(FIFOMixin, RequestRouter):
    def initialize_state(self, imbalance: int = 8) -> None:
        self.imbalance = imbalance

    async def choose_replicas(self, candidate_replicas: List[RunningReplica],
                              pending_request: Optional[PendingRequest] = None) -> List[List[RunningReplica]]:
        key = _key_of(pending_request)
        if key is None or len(candidate_replicas) < 2:
            return _least_loaded(candidate_replicas)
        order = rendezvous_order(key, [r.replica_id.unique_id for r in candidate_replicas])
        ranked = [candidate_replicas[i] for i in order]
        lengths = [self.replica_queue_len_cache.get(r.replica_id) for r in ranked]
        # a replica not asked lately counts as idle here: the least-loaded rank probes it for real
        lowest = min(0 if n is None else n for n in lengths[1:])
        if lengths[0] is not None and lengths[0] - lowest > self.imbalance:
            return _least_loaded(candidate_replicas)
        return [[r] for r in ranked]  # the key's replica, then the next by the same hash if it is full
