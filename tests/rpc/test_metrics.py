"""rpc/metrics.py: the exposition format (checked with prometheus_client's own parser), the
metric kinds, the bounded JSON-RPC labels, and ``GET /metrics`` on a live server."""

from __future__ import annotations

import json
import math
import threading

import pytest
from prometheus_client.parser import text_string_to_metric_families

from rpc.dispatcher import METHODS, Dispatcher
from rpc.errors import get_codes
from rpc.metrics import CONTENT_TYPE, Counter, Histogram, Registry, RpcMetrics, format_value
from tenzro_training.errors import UnknownTask
from tests.rpc.conformance import FakeService, get_run, req
from tests.rpc.test_server import SMALL_LIMIT, LiveServer

UNKNOWN_TASK_CODE = get_codes()["UnknownTask"]


def parse(registry: Registry) -> dict[str, dict[tuple[str, tuple[tuple[str, str], ...]], float]]:
    """family name -> {(sample name, sorted labels): value}, via the reference parser."""
    text = registry.render().decode()
    out: dict[str, dict[tuple[str, tuple[tuple[str, str], ...]], float]] = {}
    for family in text_string_to_metric_families(text):
        out[family.name] = {(s.name, tuple(sorted(s.labels.items()))): s.value for s in family.samples}
    return out


def test_counter_and_callbacks_render_in_the_text_format() -> None:
    reg = Registry()
    c = reg.counter("t_calls_total", "Calls.\nSecond line with a \\ backslash.", ("method", "code"))
    c.inc("a", "0")
    c.inc("a", "0", amount=2)
    c.inc('we"ird\\ \nlabel', "-32602")
    c.inc("C:\\new", "0")  # a backslash before an n: unescaped, a parser would read a newline
    reg.gauge_callback("t_temperature", "A gauge.", lambda: {(): 1.5})
    reg.counter_callback("t_external_total", "Kept elsewhere.", lambda: {("x",): 7}, ("kind",))
    fams = parse(reg)
    assert fams["t_calls"][("t_calls_total", (("code", "0"), ("method", "a")))] == 3
    assert fams["t_calls"][("t_calls_total", (("code", "-32602"), ("method", 'we"ird\\ \nlabel')))] == 1
    assert fams["t_calls"][("t_calls_total", (("code", "0"), ("method", "C:\\new")))] == 1
    assert fams["t_temperature"][("t_temperature", ())] == 1.5
    assert fams["t_external"][("t_external_total", (("kind", "x"),))] == 7
    text = reg.render().decode()
    assert "# HELP t_calls_total Calls.\\nSecond line with a \\\\ backslash." in text
    assert "# TYPE t_calls_total counter" in text and "# TYPE t_temperature gauge" in text
    assert text.endswith("\n") and c.get("a", "0") == 3 and c.get("b", "1") == 0


def test_counters_are_exported_at_zero_before_their_first_increment() -> None:
    """A series that first appears with value 1 hides that increment from increase(), so an
    alert on one tick failure never fired (ops probe): unlabelled counters and declared label
    sets are exported at 0 from the start; undeclared label sets still appear on first use."""
    reg = Registry()
    reg.counter("t_failures_total", "Failures.")
    declared = reg.counter("t_rejected_total", "Rejected.", ("reason",)).declare(("a",), ("b",))
    assert parse(reg)["t_failures"] == {("t_failures_total", ()): 0}
    assert parse(reg)["t_rejected"] == {("t_rejected_total", (("reason", "a"),)): 0,
                                        ("t_rejected_total", (("reason", "b"),)): 0}
    declared.inc("c")
    declared.declare(("c",))  # declaring a label set that has counted keeps its count
    assert parse(reg)["t_rejected"][("t_rejected_total", (("reason", "c"),))] == 1
    with pytest.raises(ValueError):
        declared.declare(("a", "extra"))

def test_histogram_buckets_are_cumulative() -> None:
    reg = Registry()
    h = reg.histogram("t_seconds", "Latency.", ("method",), buckets=(0.1, 1.0))
    for value in (0.05, 0.1, 0.5, 3.0):
        h.observe(value, "m")
    fams = parse(reg)["t_seconds"]
    bucket = {dict(labels)["le"]: v for (name, labels), v in fams.items() if name == "t_seconds_bucket"}
    assert bucket == {"0.1": 2, "1.0": 3, "+Inf": 4}  # a value on a bound falls in that bucket
    assert fams[("t_seconds_count", (("method", "m"),))] == 4
    assert fams[("t_seconds_sum", (("method", "m"),))] == pytest.approx(3.65)
    assert h.count("m") == 4 and h.count("other") == 0


def test_default_latency_buckets_span_1_ms_to_30_s() -> None:
    """docs/node.md promises latency buckets from 1 ms to 30 s: histogram_quantile() and
    dashboards over tenzro_rpc_request_duration_seconds read these exact bounds."""
    reg = Registry()
    reg.histogram("t_seconds", "Latency.").observe(0.3)
    bounds = [dict(labels)["le"] for (name, labels) in parse(reg)["t_seconds"] if name == "t_seconds_bucket"]
    assert bounds == ["0.001", "0.0025", "0.005", "0.01", "0.025", "0.05", "0.1", "0.25", "0.5", "1.0", "2.5",
                      "5.0", "10.0", "30.0", "+Inf"]


def test_a_callback_counter_is_typed_counter_and_its_labels_are_checked() -> None:
    """A counter kept elsewhere must still be TYPEd counter (rate() on a gauge is wrong), and a
    callback answering label values that do not fit its label names is dropped from the scrape
    rather than rendered as a malformed series."""
    reg = Registry()
    reg.counter_callback("t_external_total", "Kept elsewhere.", lambda: {("x",): 7}, ("kind",))
    reg.gauge_callback("t_wrong_labels", "Two values for one label.", lambda: {("a", "b"): 1}, ("kind",))
    text = reg.render().decode()
    assert "# TYPE t_external_total counter" in text
    assert "t_wrong_labels" not in text and 't_external_total{kind="x"} 7' in text


def test_a_failing_callback_drops_only_its_metric() -> None:
    reg = Registry()
    reg.gauge_callback("t_broken", "Raises.", lambda: 1 / 0)  # type: ignore[arg-type,return-value]
    reg.counter("t_ok_total", "Fine.").inc()
    fams = parse(reg)
    assert "t_broken" not in fams and fams["t_ok"][("t_ok_total", ())] == 1


def test_format_value() -> None:
    assert [format_value(v) for v in (3, 0.25, math.inf, -math.inf)] == ["3", "0.25", "+Inf", "-Inf"]
    assert format_value(math.nan) == "NaN" and format_value(1e-7) == "1e-07"


@pytest.mark.parametrize("make", [
    lambda r: r.counter("t_no_suffix", "Counters end in _total."),
    lambda r: r.counter("9bad_total", "Names start with a letter."),
    lambda r: r.counter("t_x_total", "Bad label.", ("has-dash",)),
    lambda r: r.counter("t.x_total", "Dots are not allowed in names."),
    lambda r: r.counter("t_x_total", "Labels starting __ are Prometheus' own.", ("__name",)),
    lambda r: r.histogram("t_h", "Repeated bound.", buckets=(0.5, 0.5, 1.0)),
    lambda r: r.histogram("t_h", "le is reserved.", ("le",)),
    lambda r: r.histogram("t_h", "Unsorted.", buckets=(1.0, 0.5)),
    lambda r: r.histogram("t_h", "Infinite.", buckets=(1.0, math.inf)),
    lambda r: r.counter_callback("t_cb", "Counters end in _total.", lambda: {}),
])
def test_invalid_metric_definitions(make: object) -> None:
    with pytest.raises(ValueError):
        make(Registry())  # type: ignore[operator]


def test_invalid_metric_use() -> None:
    reg = Registry()
    c = reg.counter("t_total", "x", ("a",))
    with pytest.raises(ValueError, match="already registered"):
        reg.counter("t_total", "again")
    with pytest.raises(ValueError, match="label values"):
        c.inc()  # one label expected
    with pytest.raises(ValueError, match="only goes up"):
        c.inc("x", amount=-1)
    c.inc("x", amount=0)  # adding nothing (an empty batch) is not going down
    assert c.get("x") == 0
    with pytest.raises(ValueError, match="label values"):
        Histogram("t_h", "x", ("a",)).observe(1.0, "a", "b")
    assert isinstance(c, Counter)


def test_concurrent_increments_are_not_lost() -> None:
    reg = Registry()
    c = reg.counter("t_total", "x")

    def work() -> None:
        for _ in range(5000):
            c.inc()
            reg.render() if _ % 1000 == 0 else None

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert c.get() == 20000


# --- what the dispatcher records -------------------------------------------------------------


def requests_by_label(reg: Registry) -> dict[tuple[str, str], float]:
    samples = parse(reg).get("tenzro_rpc_requests", {})
    return {(dict(labels)["method"], dict(labels)["code"]): v for (_n, labels), v in samples.items()}


def test_dispatcher_counts_each_request_by_method_and_code() -> None:
    reg = Registry()
    service = FakeService()
    d = Dispatcher(service, metrics=RpcMetrics(reg, METHODS))
    d.handle(json.dumps(get_run()).encode())
    d.handle(json.dumps(get_run(task_id=5)).encode())  # invalid params
    service.error = UnknownTask("t9")
    d.handle(json.dumps(get_run("t9")).encode())
    service.error = None
    d.handle(json.dumps([get_run(), req("eth_chainId"), req("x" * 10_000), 17, get_run(id=...)]).encode())
    d.handle(b"{not json")
    d.handle(b"[]")
    counts = requests_by_label(reg)
    get = "tenzro_training_getRun"
    assert counts[(get, "0")] == 3  # two answered and one notification
    assert counts[(get, "-32602")] == 1
    assert counts[(get, str(UNKNOWN_TASK_CODE))] == 1
    assert counts[("unknown", "-32601")] == 2  # names outside the method table share one label
    assert counts[("invalid", "-32600")] == 2  # a non-object batch element, an empty batch
    assert counts[("invalid", "-32700")] == 1
    latency = parse(reg)["tenzro_rpc_request_duration_seconds"]
    assert latency[("tenzro_rpc_request_duration_seconds_count", (("method", get),))] == 5
    assert not any(dict(labels).get("method") == "unknown" for (_n, labels) in latency)


# --- GET /metrics on a live server -----------------------------------------------------------


def test_metrics_endpoint_serves_the_text_format() -> None:
    with LiveServer(FakeService(), max_body_bytes=SMALL_LIMIT) as live:
        assert live.post(json.dumps(get_run()).encode())[0] == 200
        assert live.post(b" " * (SMALL_LIMIT + 1))[0] == 413
        status, headers, body = live.request("GET", "/metrics")
    assert status == 200 and headers["Content-Type"] == CONTENT_TYPE
    # The version parameter selects the parser a Prometheus server uses (docs/rpc.md: 0.0.4).
    assert CONTENT_TYPE == "text/plain; version=0.0.4; charset=utf-8"
    families = {f.name: f for f in text_string_to_metric_families(body.decode())}
    requests = {tuple(sorted(s.labels.items())): s.value for s in families["tenzro_rpc_requests"].samples}
    assert requests[(("code", "0"), ("method", "tenzro_training_getRun"))] == 1
    rejected = {s.labels["reason"]: s.value for s in families["tenzro_rpc_rejected_bodies"].samples}
    # Every reason is exported from the start (at 0), so increase() sees a first rejection.
    assert rejected == {"too_large": 1, "unreadable": 0, "unsupported_encoding": 0, "timeout": 0, "busy": 0,
                        "connection_limit": 0}


def test_a_body_that_does_not_decompress_is_a_json_400_counted_unreadable() -> None:
    """aiohttp raises RequestPayloadError (not an HttpProcessingError) for a gzip body that does
    not inflate: it was answered 200/-32603 with a logged traceback."""
    with LiveServer(FakeService(), max_body_bytes=SMALL_LIMIT) as live:
        status, _headers, body = live.request(
            "POST", "/", b"0123456789", {"Content-Type": "application/json", "Content-Encoding": "gzip"})
        assert status == 400
        assert json.loads(body)["error"]["code"] == -32600
        assert live.service.calls == []
        _status, _headers, text = live.request("GET", "/metrics")
    families = {f.name: f for f in text_string_to_metric_families(text.decode())}
    rejected = {s.labels["reason"]: s.value for s in families["tenzro_rpc_rejected_bodies"].samples}
    assert {reason: n for reason, n in rejected.items() if n} == {"unreadable": 1}


def test_a_shared_registry_carries_the_callers_metrics() -> None:
    reg = Registry()
    reg.gauge_callback("tenzro_test_gauge", "Added by the caller.", lambda: {(): 42})
    with LiveServer(FakeService(), metrics=reg) as live:
        _status, _headers, body = live.request("GET", "/metrics")
    text = body.decode()
    assert "tenzro_test_gauge 42" in text and "# TYPE tenzro_rpc_requests_total counter" in text
