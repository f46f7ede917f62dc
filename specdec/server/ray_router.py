"""Ray Serve request router for engine replicas: a spec_pool's requests prefer one replica, overflow spills.

A speculation pool learns its acceptance on the replica that decodes it, so requests tagged with one `spec_pool`
go to the same replica (rendezvous hashing over the live replica ids: adding or losing a replica moves only the
pools that hashed to it) while it has a free slot (Serve's `max_ongoing_requests` = the engine's `max_num_seqs`);
beyond that they spill to the least-loaded other replica. Untagged requests go to the least-loaded replica.

The router lives in the process that holds the deployment handle (the ingress). It also keeps what each replica
last reported through Serve's `record_routing_stats` (metrics text, pool states), which the ingress reads with
`ray_reports.replica_reports()`. (Serve pickles this module by value: it keeps no state of its own.)
"""
from __future__ import annotations

import hashlib

from ray.serve.request_router import PendingRequest, RequestRouter, RunningReplica


def rendezvous_order(tag: str, replica_ids: list[str]) -> list[str]:
    """Replica ids, most preferred first, for this tag (highest-random-weight hashing)."""
    def weight(rid: str) -> bytes:
        return hashlib.blake2b(f"{tag}\0{rid}".encode(), digest_size=8).digest()
    return sorted(replica_ids, key=weight, reverse=True)


class SpecPoolRouter(RequestRouter):
    def initialize_state(self, name: str = "engine", **_):
        self.name = name
        self._live: dict[str, RunningReplica] = {}
        from specdec.server import ray_reports

        ray_reports.register(name, self)

    def update_replicas(self, replicas: list[RunningReplica]):
        self._live = {r.replica_id.unique_id: r for r in replicas}
        return super().update_replicas(replicas)

    def on_replica_actor_died(self, replica_id):
        self._live.pop(replica_id.unique_id, None)
        return super().on_replica_actor_died(replica_id)

    async def choose_replicas(self, candidate_replicas: list[RunningReplica],
                              pending_request: PendingRequest | None = None) -> list[list[RunningReplica]]:
        if pending_request is not None:
            # one pass over the ranks, then Serve backs off before the next (without this it would spin)
            pending_request.routing_context.should_backoff = True
        tag = pending_request.kwargs.get("affinity") if pending_request is not None else None
        if tag is None or len(candidate_replicas) < 2:
            return [candidate_replicas]          # Serve picks the lowest queue length among them
        by_id = {r.replica_id.unique_id: r for r in candidate_replicas}
        order = rendezvous_order(tag, list(by_id))
        return [[by_id[order[0]]], [by_id[rid] for rid in order[1:]]]

    def reports(self) -> dict[str, dict]:
        return {rid: dict(r.routing_stats or {}) for rid, r in self._live.items()}

