"""Operator metrics in the Prometheus text exposition format (version 0.0.4), served by the node
at ``GET /metrics``.

What this module is: :class:`Registry` with three metric kinds (:class:`Counter`,
:class:`Histogram`, and callback gauges/counters read at scrape time), rendered by
:meth:`Registry.render`; :class:`RpcMetrics`, the JSON-RPC request counters and latency
histograms the dispatcher feeds.

What it is NOT: a client library. prometheus_client would do, but the node needs three metric
kinds and one output format, and a registry of its own keeps label sets bounded by
construction (method labels come from the dispatcher's method table, never from the request).

Thread safety: the dispatcher records from its worker thread while the event loop renders, so
every mutation and the render hold the registry's lock. Scrape-time callbacks run under that
lock too; they must be quick and must not call back into the registry.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Final

__all__ = [
    "CONTENT_TYPE",
    "DEFAULT_LATENCY_BUCKETS",
    "Counter",
    "Histogram",
    "Registry",
    "RpcMetrics",
]

CONTENT_TYPE: Final = "text/plain; version=0.0.4; charset=utf-8"
DEFAULT_LATENCY_BUCKETS: Final = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
"""Seconds: a getRun answers in well under 1 ms, a finalize of a large model takes seconds."""

Labels = tuple[str, ...]
Samples = Mapping[Labels, float]


def _check_name(name: str) -> None:
    ok = name and (name[0].isalpha() or name[0] in "_:") and all(c.isalnum() or c in "_:" for c in name)
    if not ok or not name.isascii():
        raise ValueError(f"invalid metric or label name {name!r}")


def _escape_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def format_value(value: float) -> str:
    """Integers without a fraction, floats by repr (shortest round-trip), +Inf/-Inf/NaN."""
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    value = float(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(value)


def _label_text(names: Sequence[str], values: Labels, extra: str = "") -> str:
    parts = [f'{n}="{_escape_label(v)}"' for n, v in zip(names, values)]
    if extra:
        parts.append(extra)
    return "{" + ",".join(parts) + "}" if parts else ""


class _Metric:
    kind = ""

    def __init__(self, name: str, help: str, labelnames: Sequence[str]) -> None:
        _check_name(name)
        for label in labelnames:
            _check_name(label)
            if label.startswith("__") or label == "le":
                raise ValueError(f"reserved label name {label!r}")
        self.name = name
        self.help = help
        self.labelnames = tuple(labelnames)

    def _labels(self, labels: Iterable[str]) -> Labels:
        values = tuple(labels)
        if len(values) != len(self.labelnames) or not all(isinstance(v, str) for v in values):
            raise ValueError(f"{self.name} takes {len(self.labelnames)} string label values, got {values!r}")
        return values

    def header(self) -> list[str]:
        return [f"# HELP {self.name} {_escape_help(self.help)}", f"# TYPE {self.name} {self.kind}"]

    def lines(self) -> list[str]:  # pragma: no cover - overridden
        raise NotImplementedError


class Counter(_Metric):
    """A monotonically increasing count per label set."""

    kind = "counter"

    def __init__(self, name: str, help: str, labelnames: Sequence[str] = (), lock: threading.Lock | None = None) -> None:
        if not name.endswith("_total"):
            raise ValueError(f"counter {name!r} must end in _total")
        super().__init__(name, help, labelnames)
        self._lock = lock or threading.Lock()
        # An unlabelled counter is exported at 0 from the start: a series that appears only with
        # its first increment hides that increment from increase()/rate(), so an alert on a
        # single failure never fires (ops probe). Labelled ones: see ``declare``.
        self._values: dict[Labels, float] = {} if self.labelnames else {(): 0}

    def declare(self, *label_sets: Sequence[str]) -> Counter:
        """Export these label sets at 0 until they are first incremented (the known values of a
        bounded label, e.g. every rejection reason). Returns the counter."""
        keys = [self._labels(labels) for labels in label_sets]
        with self._lock:
            for key in keys:
                self._values.setdefault(key, 0)
        return self

    def inc(self, *labels: str, amount: float = 1) -> None:
        if not amount >= 0:
            raise ValueError("a counter only goes up")
        key = self._labels(labels)
        with self._lock:
            self._values[key] = self._values.get(key, 0) + amount

    def get(self, *labels: str) -> float:
        with self._lock:
            return self._values.get(self._labels(labels), 0)

    def lines(self) -> list[str]:
        return [f"{self.name}{_label_text(self.labelnames, k)} {format_value(v)}" for k, v in sorted(self._values.items())]


class Histogram(_Metric):
    """Cumulative buckets, sum and count per label set."""

    kind = "histogram"

    def __init__(
        self,
        name: str,
        help: str,
        labelnames: Sequence[str] = (),
        buckets: Sequence[float] = DEFAULT_LATENCY_BUCKETS,
        lock: threading.Lock | None = None,
    ) -> None:
        super().__init__(name, help, labelnames)
        bounds = [float(b) for b in buckets]
        if not bounds or any(not math.isfinite(b) for b in bounds) or bounds != sorted(set(bounds)):
            raise ValueError("buckets must be finite, strictly increasing and not empty")
        self.buckets = tuple(bounds)
        self._lock = lock or threading.Lock()
        self._series: dict[Labels, tuple[list[int], list[float]]] = {}  # (bucket counts, [sum])

    def observe(self, value: float, *labels: str) -> None:
        key = self._labels(labels)
        with self._lock:
            counts, total = self._series.setdefault(key, ([0] * (len(self.buckets) + 1), [0.0]))
            for i, bound in enumerate(self.buckets):
                if value <= bound:
                    counts[i] += 1
                    break
            else:
                counts[-1] += 1
            total[0] += value

    def count(self, *labels: str) -> int:
        with self._lock:
            series = self._series.get(self._labels(labels))
            return 0 if series is None else sum(series[0])

    def lines(self) -> list[str]:
        out = []
        for key, (counts, total) in sorted(self._series.items()):
            running = 0
            for bound, n in zip((*self.buckets, math.inf), counts):
                running += n
                le = f'le="{format_value(bound)}"'
                out.append(f"{self.name}_bucket{_label_text(self.labelnames, key, le)} {running}")
            out.append(f"{self.name}_sum{_label_text(self.labelnames, key)} {format_value(total[0])}")
            out.append(f"{self.name}_count{_label_text(self.labelnames, key)} {running}")
        return out


class _Callback(_Metric):
    """Samples read at scrape time from a callback (a gauge, or a counter kept elsewhere)."""

    def __init__(self, kind: str, name: str, help: str, labelnames: Sequence[str], read: Callable[[], Samples]) -> None:
        if kind == "counter" and not name.endswith("_total"):
            raise ValueError(f"counter {name!r} must end in _total")
        super().__init__(name, help, labelnames)
        self.kind = kind
        self._read = read

    def lines(self) -> list[str]:
        samples = {self._labels(k): v for k, v in self._read().items()}
        return [f"{self.name}{_label_text(self.labelnames, k)} {format_value(v)}" for k, v in sorted(samples.items())]


class Registry:
    """Named metrics, rendered in registration order."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._metrics: dict[str, _Metric] = {}

    def _add(self, metric: _Metric) -> _Metric:
        with self._lock:
            if metric.name in self._metrics:
                raise ValueError(f"metric {metric.name!r} is already registered")
            self._metrics[metric.name] = metric
        return metric

    def counter(self, name: str, help: str, labelnames: Sequence[str] = ()) -> Counter:
        return self._add(Counter(name, help, labelnames, self._lock))  # type: ignore[return-value]

    def histogram(
        self, name: str, help: str, labelnames: Sequence[str] = (), buckets: Sequence[float] = DEFAULT_LATENCY_BUCKETS
    ) -> Histogram:
        return self._add(Histogram(name, help, labelnames, buckets, self._lock))  # type: ignore[return-value]

    def gauge_callback(self, name: str, help: str, read: Callable[[], Samples], labelnames: Sequence[str] = ()) -> None:
        """A gauge whose samples ``read()`` returns at each scrape: ``{label values: value}``."""
        self._add(_Callback("gauge", name, help, labelnames, read))

    def counter_callback(self, name: str, help: str, read: Callable[[], Samples], labelnames: Sequence[str] = ()) -> None:
        """A counter kept by another component (e.g. the libp2p host), read at each scrape."""
        self._add(_Callback("counter", name, help, labelnames, read))

    def render(self) -> bytes:
        """The exposition text. A failing callback drops that metric from this scrape only (a
        scrape must not fail because one component is shutting down)."""
        out: list[str] = []
        with self._lock:
            for metric in self._metrics.values():
                try:
                    lines = metric.lines()
                except Exception:  # noqa: BLE001 - see the docstring
                    continue
                out.extend(metric.header())
                out.extend(lines)
        return ("\n".join(out) + "\n").encode()


class RpcMetrics:
    """What the dispatcher records per JSON-RPC request: a count by method and outcome code
    (``"0"`` for a result, else the JSON-RPC error code) and the latency by method.

    Method labels are bounded: a name outside ``methods`` is counted as ``"unknown"`` and a
    request refused before its method is looked up (bad JSON, not a valid request object, an
    empty batch) as ``"invalid"``, so a client cannot grow the label set.
    """

    def __init__(self, registry: Registry, methods: Iterable[str]) -> None:
        self.methods = frozenset(methods)
        self.requests = registry.counter(
            "tenzro_rpc_requests_total",
            "JSON-RPC requests answered (batch elements counted one by one), by method and outcome "
            "code: 0 for a result, else the JSON-RPC error code (docs/rpc.md).",
            ("method", "code"),
        )
        self.latency = registry.histogram(
            "tenzro_rpc_request_duration_seconds",
            "Time spent in the service per JSON-RPC request that named a known method.",
            ("method",),
        )

    def label(self, name: object) -> str:
        if not isinstance(name, str):
            return "invalid"
        return name if name in self.methods else "unknown"

    def record(self, name: object, code: int, seconds: float | None) -> None:
        label = self.label(name)
        self.requests.inc(label, str(code))
        if seconds is not None and label not in ("unknown", "invalid"):
            self.latency.observe(seconds, label)
