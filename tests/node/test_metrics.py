"""node/metrics.py: each cache metric reads its own NodeService.cache_stats() entry."""

from __future__ import annotations

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
    metrics.attach(FakeService())
    got = {(s.name, s.labels["encoding"]): s.value
           for family in text_string_to_metric_families(registry.render().decode())
           for s in family.samples if "encoding" in s.labels}
    assert got == {("tenzro_node_submissions_accepted_total", "raw"): 0, ("tenzro_node_submissions_accepted_total", "topk"): 8,
                   ("tenzro_node_submission_bytes_total", "raw"): 0, ("tenzro_node_submission_bytes_total", "topk"): 3000}


class FakeHost:
    def stats(self) -> dict[str, int]:
        return {"published": 1, "delivered": 2, "rejected": 3, "ignored": 4, "dropped_outbound": 0,
                "dropped_inbox": 0, "reconnects": 0, "bootstrap_unreachable": 0, "stalled_peers": 2}

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
