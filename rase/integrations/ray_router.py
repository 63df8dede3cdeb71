"""Ray Serve request router for rase replicas: a request with a route key goes to the replica
its key hashes to (rendezvous hashing over the running replicas), so its prompt prefix meets the
prefix cache that holds it; when that replica has more than `imbalance` requests over the least
loaded one, or no key, the least loaded replica takes it (by the requests this router has chosen
or in flight on each, or Ray's cached count where higher).

Hashing needs no shared state: every ingress replica and every node picks the same replica for
a key, and a replica that dies moves only the keys it held."""
from __future__ import annotations

import random
import time
from collections import Counter
from typing import List, Optional

from ray.serve.request_router import PendingRequest, RequestRouter, RunningReplica

from .route_key import rendezvous_order

CHOICE_TTL_S = 2.0  # a choice not sent by then was dropped (its client left while it was routed)


def _key_of(pending: Optional[PendingRequest]) -> str | None:
    if pending is None or not pending.args:
        return None
    return getattr(pending.args[0], "route_key", None)


def _by_load(replicas: List[RunningReplica], load: list[int]) -> List[List[RunningReplica]]:
    """One replica per rank, least loaded first, ties in random order (Ray takes the first rank
    that has room; a rank of several would be decided by Ray's lagging counts instead)."""
    order = sorted(random.sample(range(len(replicas)), len(replicas)), key=lambda i: load[i])
    return [[replicas[i]] for i in order]


class PrefixAffinityRouter(RequestRouter):
    """No FIFOMixin: Ray then hands each chosen replica to the request it was chosen for, not to
    the oldest one waiting, whose key may hash elsewhere (as Ray's own ConsistentHashRouter)."""

    def initialize_state(self, imbalance: int = 8) -> None:
        self.imbalance = imbalance
        self.in_flight: Counter = Counter()  # replica id -> requests sent there, not finished
        # internal request id -> (replica id, monotonic s): chosen, not yet sent. Ray's routing
        # tasks choose for a whole burst before the first request is sent, so counting from the
        # send alone saw every replica idle and put 20 requests of one key on one replica
        self.chosen: dict = {}

    def on_send_request(self, replica_id) -> None:  # right after each dispatch (Ray: exactly one completion follows)
        super().on_send_request(replica_id)
        self.in_flight[replica_id] += 1
        # the choice now sent: any one made for this replica (per-replica counts are what matter)
        rid = next((rid for rid, (rep, _) in self.chosen.items() if rep == replica_id), None)
        if rid is not None:
            del self.chosen[rid]

    def on_request_completed(self, replica_id, internal_request_id: str) -> None:
        self.in_flight[replica_id] = max(0, self.in_flight[replica_id] - 1)
        self.chosen.pop(internal_request_id, None)  # completed unsent (rejected, failed to send)

    def _load(self, ranked: List[RunningReplica]) -> list[int]:
        """Requests on each replica: what this router chose for it or has in flight there, or
        Ray's cached count when higher (other ingresses send too). Ray's alone lags in a burst
        (each replica's own count, as requests reach it, overwrites the router's)."""
        now = time.monotonic()
        self.chosen = {rid: c for rid, c in self.chosen.items() if now - c[1] < CHOICE_TTL_S}
        pending = Counter(rep for rep, _ in self.chosen.values())
        return [max(self.in_flight[r.replica_id] + pending[r.replica_id],
                    self.replica_queue_len_cache.get(r.replica_id) or 0) for r in ranked]

    def _ranks(self, candidate_replicas: List[RunningReplica], key: str | None) -> List[List[RunningReplica]]:
        """Replicas in the order Ray should try them, one per rank."""
        if key is None or len(candidate_replicas) < 2:
            return _by_load(candidate_replicas, self._load(candidate_replicas))
        order = rendezvous_order(key, [r.replica_id.unique_id for r in candidate_replicas])
        ranked = [candidate_replicas[i] for i in order]
        load = self._load(ranked)
        if load[0] - min(load[1:]) > self.imbalance:
            return _by_load(ranked, load)
        return [[r] for r in ranked]  # the key's replica, then the next by the same hash if it is full

    async def choose_replicas(self, candidate_replicas: List[RunningReplica],
                              pending_request: Optional[PendingRequest] = None) -> List[List[RunningReplica]]:
        if pending_request is None:
            return self._ranks(candidate_replicas, None)
        rid = pending_request.metadata.internal_request_id
        self.chosen.pop(rid, None)  # chosen again (all ranks were full): not counted twice
        ranks = self._ranks(candidate_replicas, _key_of(pending_request))
        if ranks:
            self.chosen[rid] = (ranks[0][0].replica_id, time.monotonic())
        return ranks
