"""The node's own metrics on the registry ``GET /metrics`` renders (``rpc/metrics.py``): runs by
status, run events, tick failures, the model and payload caches and, with gossip on, the libp2p
host's and the gossip bridge's counters. docs/node.md "Metrics" lists every name.

Why these are read at scrape time instead of pushed: the host and the bridge already keep
counters (their ``stats()``/``counters``), and the run table is the service's dict of immutable
RunStates, so a scrape reads the current values without adding work to the paths that change
them. Every read here is a snapshot safe from the event-loop thread (a dict copy or int reads
under the GIL); nothing here calls into the service's executor, so a scrape answers at once even
during a long finalizeRound.
"""

from __future__ import annotations

import time
from typing import Any

from rpc.metrics import Counter, Registry
from tenzro_training import __version__
from tenzro_training.payload import ENCODINGS
from tenzro_training.run_events import RunEvent
from tenzro_training.run_state import RunStatus

__all__ = ["NodeMetrics", "register_gossip_metrics"]

# (kind, name, help, key of NodeService.cache_stats())
_CACHE_METRICS: tuple[tuple[str, str, str, str], ...] = (
    ("gauge", "tenzro_node_model_cache_runs",
     "Runs whose committed fp32 weights and momentum are held in memory.", "model_cache_runs"),
    ("gauge", "tenzro_node_model_cache_bytes",
     "Bytes of those weights and momentum (model_cache_bytes at most, unless 2 runs alone are above it).",
     "model_cache_bytes"),
    ("gauge", "tenzro_node_payload_cache_bytes",
     "Bytes of accepted payloads of open rounds held for their finalize.", "payload_cache_bytes"),
    ("counter", "tenzro_node_model_rebuilds_total",
     "Times a run's model was rebuilt from its stored snapshot (restart, cache eviction, failed finalize).",
     "model_rebuilds"),
    ("counter", "tenzro_node_replayed_rounds_total",
     "Committed rounds replayed from stored payloads by those rebuilds.", "replayed_rounds"),
    ("counter", "tenzro_node_payloads_pruned_total", "Stored payloads deleted by prune_payloads.", "payloads_pruned"),
    ("gauge", "tenzro_node_round_buffer_bytes",
     "Bytes of scratch kept for round computations (aggregates and the outer step; the largest model so far).",
     "round_buffer_bytes"),
)
_GOSSIP_KINDS = ("published", "delivered", "rejected", "ignored", "dropped_outbound", "dropped_inbox")


class NodeMetrics:
    """Node-wide metrics: registered once per process, fed by ``run_node``."""

    def __init__(self, registry: Registry, *, chain_id: int) -> None:
        self.registry = registry
        self._service: Any = None
        started = time.time()
        registry.gauge_callback(
            "tenzro_node_info", "Always 1; the labels say which software serves which chain.",
            lambda: {(__version__, str(chain_id)): 1}, ("version", "chain_id"),
        )
        registry.gauge_callback(
            "tenzro_node_start_time_seconds", "Unix time the node process started.", lambda: {(): started},
        )
        registry.gauge_callback(
            "tenzro_runs", "Runs held by the node, by status (every status listed, 0 included).",
            self._runs_by_status, ("status",),
        )
        self.events: Counter = registry.counter(
            "tenzro_run_events_total", "Run events committed (RunPosted, RoundFinalized, RunSealed...), by type.",
            ("event",),
        ).declare(*((name,) for name in sorted({cls.__name__ for cls in RunEvent.__subclasses__()})))  # 0 until the first
        for kind, name, help_text, stat in _CACHE_METRICS:
            register = registry.gauge_callback if kind == "gauge" else registry.counter_callback
            register(name, help_text, lambda stat=stat: {(): self._cache_stat(stat)})
        for index, (name, help_text) in enumerate((
            ("tenzro_node_submissions_accepted_total",
             "Outer-gradient submissions accepted since start, by payload encoding (raw, topk, q8)."),
            ("tenzro_node_submission_bytes_total",
             "Payload bytes of those submissions, by payload encoding: what compression saves in upload and storage."),
        )):
            registry.counter_callback(name, help_text, lambda index=index: self._accepted(index), ("encoding",))
        self.tick_failures: Counter = registry.counter(
            "tenzro_tick_failures_total", "Clock ticks that raised (logged; the tick is retried).",
        )

    def attach(self, service: Any) -> None:
        """Read run counts from ``service`` (a NodeService) from now on."""
        self._service = service

    def _runs_by_status(self) -> dict[tuple[str, ...], float]:
        counts = dict.fromkeys((s.value for s in RunStatus), 0)
        if self._service is not None:
            for status, n in self._service.count_runs_by_status().items():
                counts[status] = n
        return {(status,): n for status, n in counts.items()}

    def _cache_stat(self, name: str) -> float:
        return 0 if self._service is None else self._service.cache_stats()[name]

    def _accepted(self, index: int) -> dict[tuple[str, ...], float]:
        stats = {} if self._service is None else self._service.accepted_payload_stats()
        return {(encoding,): stats.get(encoding, (0, 0))[index] for encoding in sorted({*ENCODINGS, *stats})}

    def on_event(self, event: object) -> None:
        self.events.inc(type(event).__name__)


def register_gossip_metrics(registry: Registry, host: Any, bridge: Any) -> None:
    """The libp2p host's message counters and peer counts, and the bridge's work counters."""

    def messages() -> dict[tuple[str, ...], float]:
        stats = host.stats()
        return {(kind,): stats[kind] for kind in _GOSSIP_KINDS}

    registry.counter_callback(
        "tenzro_gossip_messages_total",
        "Gossip messages by fate: published, delivered (to a subscription), rejected/ignored (by a "
        "validator), dropped_outbound/dropped_inbox (lost to a full queue: should stay 0).",
        messages, ("kind",),
    )
    registry.counter_callback(
        "tenzro_gossip_reconnects_total", "Bootstrap peers connected again after being lost or unreachable.",
        lambda: {(): host.stats()["reconnects"]},
    )
    registry.gauge_callback(
        "tenzro_gossip_bootstrap_unreachable", "Bootstrap peers without a stream at the last check.",
        lambda: {(): host.stats()["bootstrap_unreachable"]},
    )
    registry.gauge_callback(
        "tenzro_gossip_peers", "Peers with an open pubsub stream.", lambda: {(): len(host.connected_peers())},
    )
    registry.counter_callback(
        "tenzro_gossip_streams_total",
        "Payload streams at the node's reassembly buffer by fate: completed, evicted (stale, for room), "
        "refused (new stream, no room), hash_mismatch (bytes did not hash to the signed payload hash). "
        "evicted/refused/hash_mismatch streams are accepted again when republished.",
        lambda: {(fate,): n for fate, n in bridge.stream_stats().items() if fate != "buffer_bytes"}, ("fate",),
    )
    registry.gauge_callback(
        "tenzro_gossip_assembly_buffer_bytes",
        "Current bound of the payload reassembly buffer (trainer_count x largest payload, summed over runs in "
        "training, capped by max_assembly_bytes).",
        lambda: {(): bridge.stream_stats()["buffer_bytes"]},
    )
    registry.counter_callback(
        "tenzro_gossip_stalled_peers_total",
        "Times a peer's outbound queue stayed full past publish_timeout_s: it is no longer waited for.",
        lambda: {(): host.stats().get("stalled_peers", 0)},
    )
    registry.counter_callback(
        "tenzro_gossip_bridge_total",
        "Gossip bridge work: payloads_stored/payloads_refused (reassembled outer gradients; refused also "
        "counts streams whose bytes failed the hash check), tickets, model_answers (ModelRequest answers), "
        "model_requests_limited (requests dropped by the per-requester limit), finalized_published "
        "(RoundFinalized notices).",
        lambda: {(name,): n for name, n in dict(bridge.counters).items()}, ("what",),
    )
