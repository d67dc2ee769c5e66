"""node/metrics.py: each cache metric reads its own NodeService.cache_stats() entry."""

from __future__ import annotations

import time

import pytest
from prometheus_client.parser import text_string_to_metric_families

from rpc.metrics import Registry
from tenzro_training.node.metrics import NodeMetrics
from tests.node.conftest import Net


class FakeService:
    def count_runs_by_status(self) -> dict[str, int]:
        return {"Training": 2}

    def cache_stats(self) -> dict[str, int]:
        return {"model_cache_runs": 1, "model_cache_bytes": 4096, "payload_cache_bytes": 2048, "model_rebuilds": 3, "replayed_rounds": 7,
                "payloads_pruned": 12, "round_buffer_bytes": 4096}

    def accepted_payload_stats(self) -> dict[str, tuple[int, int]]:
        return {"topk": (8, 3000)}


def samples(registry: Registry) -> dict[str, float]:
    out = {}
    for family in text_string_to_metric_families(registry.render().decode()):
        for sample in family.samples:
            if not sample.labels:
                out[sample.name] = sample.value
    return out


def test_cache_metrics_read_their_own_stat() -> None:
    registry = Registry()
    metrics = NodeMetrics(registry, chain_id=1337)
    before = samples(registry)
    assert before["tenzro_node_payload_cache_bytes"] == 0  # no service attached yet
    metrics.attach(FakeService())
    got = samples(registry)
    assert got["tenzro_node_model_cache_runs"] == 1
    assert got["tenzro_node_payload_cache_bytes"] == 2048
    assert got["tenzro_node_model_rebuilds_total"] == 3
    assert got["tenzro_node_replayed_rounds_total"] == 7
    assert got["tenzro_node_payloads_pruned_total"] == 12
    assert got["tenzro_node_round_buffer_bytes"] == 4096


def test_accepted_submissions_by_encoding_list_every_encoding() -> None:
    registry = Registry()
    metrics = NodeMetrics(registry, chain_id=1337)
    text = registry.render().decode()
    assert 'tenzro_node_submissions_accepted_total{encoding="raw"} 0' in text
    assert 'tenzro_node_submission_bytes_total{encoding="topk"} 0' in text
    assert 'tenzro_node_submission_bytes_total{encoding="q8"} 0' in text
    metrics.attach(FakeService())
    got = {(s.name, s.labels["encoding"]): s.value
           for family in text_string_to_metric_families(registry.render().decode())
           for s in family.samples if "encoding" in s.labels}
    assert got == {("tenzro_node_submissions_accepted_total", "raw"): 0, ("tenzro_node_submissions_accepted_total", "topk"): 8,
                   ("tenzro_node_submissions_accepted_total", "q8"): 0,
                   ("tenzro_node_submission_bytes_total", "raw"): 0, ("tenzro_node_submission_bytes_total", "topk"): 3000,
                   ("tenzro_node_submission_bytes_total", "q8"): 0}


class FakeHost:
    def stats(self) -> dict[str, int]:
        return {"published": 1, "delivered": 2, "rejected": 3, "ignored": 4, "dropped_outbound": 5,
                "dropped_inbox": 6, "reconnects": 7, "bootstrap_unreachable": 8, "stalled_peers": 2}

    def connected_peers(self) -> list[str]:
        return ["a"]


class FakeBridge:
    counters = {"payloads_stored": 5, "payloads_refused": 1}

    def stream_stats(self) -> dict[str, int]:
        return {"completed": 5, "evicted": 2, "refused": 3, "hash_mismatch": 1, "buffer_bytes": 1 << 20}


def test_gossip_stream_fates_and_stalled_peers_are_exported() -> None:
    from tenzro_training.node.metrics import register_gossip_metrics

    registry = Registry()
    register_gossip_metrics(registry, FakeHost(), FakeBridge())
    fates = {}
    for family in text_string_to_metric_families(registry.render().decode()):
        for sample in family.samples:
            if sample.name == "tenzro_gossip_streams_total":
                fates[sample.labels["fate"]] = sample.value
    assert fates == {"completed": 5, "evicted": 2, "refused": 3, "hash_mismatch": 1}
    got = samples(registry)
    assert got["tenzro_gossip_assembly_buffer_bytes"] == 1 << 20
    assert got["tenzro_gossip_stalled_peers_total"] == 2


def test_a_run_ending_during_a_scrape_is_counted_once(net: Net, checkpoint: tuple[str, str],
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """An ending run goes into the ended table before it leaves the open one; a scrape between
    the two counted it under both statuses (review)."""
    from tests.node.conftest import spec_dict

    service = net.service
    net.post(spec_dict(*checkpoint))
    seen = []
    real = service._cache_ended
    monkeypatch.setattr(service, "_cache_ended",
                        lambda t, r, s: (seen.append(service.count_runs_by_status()), real(t, r, s)))
    net.cancel()
    assert seen == [{"Cancelled": 1}] == [service.count_runs_by_status()]


def exposition(registry: Registry) -> tuple[dict[str, str], dict[tuple[str, tuple[tuple[str, str], ...]], float]]:
    """(metric name -> its # TYPE, {(sample name, sorted labels): value}) of one scrape."""
    text = registry.render().decode()
    types = dict(line.split()[2:4] for line in text.splitlines() if line.startswith("# TYPE "))
    values = {(s.name, tuple(sorted(s.labels.items()))): s.value
              for family in text_string_to_metric_families(text) for s in family.samples}
    return types, values


def test_node_metric_names_types_and_labels_are_the_documented_ones() -> None:
    """Dashboards and alerts select these series by name, type and label (docs/node.md
    "Metrics"): a renamed metric or label, or a gauge turned counter, silently empties a panel or
    disarms an alert, so the whole exposition of a node without gossip is pinned here."""
    from tenzro_training import __version__
    from tenzro_training.run_events import RunCancelled

    registry = Registry()
    before = time.time()
    metrics = NodeMetrics(registry, chain_id=1337)
    after = time.time()
    metrics.attach(FakeService())
    metrics.on_event(RunCancelled(task_id="t", at_ms=0))
    metrics.tick_failures.inc()
    types, values = exposition(registry)
    assert types == {
        "tenzro_node_info": "gauge", "tenzro_node_start_time_seconds": "gauge", "tenzro_runs": "gauge",
        "tenzro_run_events_total": "counter", "tenzro_node_model_cache_runs": "gauge",
        "tenzro_node_model_cache_bytes": "gauge", "tenzro_node_payload_cache_bytes": "gauge",
        "tenzro_node_model_rebuilds_total": "counter", "tenzro_node_replayed_rounds_total": "counter",
        "tenzro_node_payloads_pruned_total": "counter", "tenzro_node_round_buffer_bytes": "gauge",
        "tenzro_node_submissions_accepted_total": "counter", "tenzro_node_submission_bytes_total": "counter",
        "tenzro_tick_failures_total": "counter",
    }
    assert values[("tenzro_node_info", (("chain_id", "1337"), ("version", __version__)))] == 1
    assert before <= values[("tenzro_node_start_time_seconds", ())] <= after
    runs = {dict(labels)["status"]: v for (name, labels), v in values.items() if name == "tenzro_runs"}
    assert runs == {"Posted": 0, "Electing": 0, "Enrolling": 0, "Training": 2, "Sealed": 0, "Cancelled": 0, "Failed": 0}
    events = {dict(labels)["event"]: v for (name, labels), v in values.items() if name == "tenzro_run_events_total"}
    assert events["RunCancelled"] == 1 and events["RunSealed"] == 0 and events["SyncerFailover"] == 0
    assert set(events) >= {"RunPosted", "RoundFinalized", "TrainerSlashed", "DeadlinesExtended", "RunFailed"}
    assert values[("tenzro_node_model_cache_bytes", ())] == 4096
    assert values[("tenzro_tick_failures_total", ())] == 1


def test_gossip_metric_names_types_and_labels_are_the_documented_ones() -> None:
    """The gossip half of docs/node.md "Metrics": every message fate is exported (the two drop
    counts are what an operator alerts on), each scalar reads its own host statistic."""
    from tenzro_training.node.metrics import register_gossip_metrics

    registry = Registry()
    register_gossip_metrics(registry, FakeHost(), FakeBridge())
    types, values = exposition(registry)
    assert types == {
        "tenzro_gossip_messages_total": "counter", "tenzro_gossip_reconnects_total": "counter",
        "tenzro_gossip_bootstrap_unreachable": "gauge", "tenzro_gossip_peers": "gauge",
        "tenzro_gossip_streams_total": "counter", "tenzro_gossip_assembly_buffer_bytes": "gauge",
        "tenzro_gossip_stalled_peers_total": "counter", "tenzro_gossip_bridge_total": "counter",
    }
    messages = {dict(labels)["kind"]: v for (name, labels), v in values.items() if name == "tenzro_gossip_messages_total"}
    assert messages == {"published": 1, "delivered": 2, "rejected": 3, "ignored": 4, "dropped_outbound": 5,
                        "dropped_inbox": 6}
    assert values[("tenzro_gossip_reconnects_total", ())] == 7
    assert values[("tenzro_gossip_bootstrap_unreachable", ())] == 8
    assert values[("tenzro_gossip_peers", ())] == 1
    bridge = {dict(labels)["what"]: v for (name, labels), v in values.items() if name == "tenzro_gossip_bridge_total"}
    assert bridge == {"payloads_stored": 5, "payloads_refused": 1}
