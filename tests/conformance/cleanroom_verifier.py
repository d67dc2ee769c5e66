#!/usr/bin/env python3
"""Clean-room verifier: recompute every committed value of a node's sealed runs from the docs alone.

THE RULE THAT MAKES IT WORTH HAVING: this file is written from ``docs/*.md`` and SPEC.md only. It
never imports the project (``tenzro_training``, ``storage``, ``rpc``, ``precompile``; a guard in
``main`` makes such an import fail) and nobody may write it by reading the project's code. It
uses numpy, hashlib, rfc8785, eth_abi, eth_utils and rocksdict. So when it disagrees with the
node, either the code or the docs are wrong: fix one of them. Never "fix" the verifier by copying
what the code does. A third party reproducing the protocol has only the docs, and this file
stands for that third party. Every check names the doc section it follows.

For every sealed run in a node's RocksDB store it recomputes, and compares with what the node
committed: the spec hash and election seed; the initial model hash of the fp32-widened
checkpoint; the fragment layouts; each round's aggregates for Mean, TrimmedMean,
CoordinateMedian and Krum from the stored payloads (raw, and topk or q8 where the spec selects it:
payload.md "Encodings", "topk", "q8"), with their aggregate and report hashes; the
outer Nesterov step and the model hashes; the stored snapshot and final weights; the round
records, the run root and the audit paths; the ReceiptV1 ABI and the sealed record; the final
model file, byte for byte; and the payouts and the whole ledger.

Not covered: trainers on the gossip path, ``prune_payloads`` stores (their payloads are gone),
late slashing, Multi-Krum, and re-verifying the VRF tickets and the EIP-712 signatures.

Usage (read the store of a stopped node, or a copy of a running node's ``db``)::

    python cleanroom_verifier.py --db DATA_DIR/db --data-dir DATA_DIR [--json-dir D | --rpc URL]
        [--task-id T ...] [--require-no-project]

``--json-dir`` holds saved getRun / getReceipt answers (``<task>.run.json``,
``<task>.receipt.json``); with ``--rpc`` they are fetched from a live node. Without either, the
checks that need them (election seed, getRun layouts, receipt ABI) are skipped and listed as
notes. Exit status: 0 when every check passed, 1 when one failed, 2 on a usage error.
The last line is ``SUMMARY runs=N runs_passed=N checks=N passed=N failed=N notes=N``.

Mutation controls show that the checks discriminate: ``VERIFY_MUTATE=<name>`` runs it with one
deliberate deviation from the docs (see ``MUTATIONS``). Each one except ``median_f32`` makes
some check fail on runs that hold the relevant rule.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.abc
import importlib.util
import json
import math
import os
import struct
import sys
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator
from urllib.parse import unquote, urlparse

import numpy as np
import rfc8785
from eth_abi import encode as abi_encode
from eth_utils import to_checksum_address

f32 = np.float32
f64 = np.float64

PROJECT_PACKAGES = ("tenzro_training", "storage", "rpc", "precompile")

MUTATIONS = {
    "reverse_order": "aggregate the accepted inputs in reverse canonical order",
    "numpy_mean": "Mean as numpy.mean (another summation order)",
    "no_plus_zero": "CoordinateMedian / TrimmedMean without the final +0.0",
    "median_f32": "even-K median as fl32(a + b) / 2 (differs only on overflow)",
    "krum_plain_f64": "Krum distances without the 22-bit block quantization",
    "outer_f64": "outer step evaluated in float64 and rounded once",
    "topk_reversed": "topk payloads: values[k-1-i] written at indices[i] (the scatter order ignored)",
    "topk_drop_one": "topk payloads: the last value left out (zero at its index)",
    "q8_unsigned": "q8 payloads: the int8 values read as unsigned bytes",
    "q8_scale_per_tensor": "q8 payloads: every block scaled by the largest scale",
}
MUTATE = os.environ.get("VERIFY_MUTATE", "")


class ProjectImportBlocker(importlib.abc.MetaPathFinder):
    """Makes ``import tenzro_training`` (and the other project packages) fail in this process."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> None:
        if fullname.split(".")[0] in PROJECT_PACKAGES:
            raise ImportError(f"the clean-room verifier must not import the project ({fullname})")
        return None


def project_packages_findable() -> list[str]:
    return [p for p in PROJECT_PACKAGES if p in sys.modules or importlib.util.find_spec(p) is not None]


# --- results --------------------------------------------------------------------------------------


@dataclass
class Check:
    task: str
    what: str
    ok: bool | None  # None: a note, not a check
    detail: str = ""


@dataclass
class Results:
    rows: list[Check] = field(default_factory=list)

    def check(self, task: str, what: str, ok: bool, detail: str = "") -> bool:
        self.rows.append(Check(task, what, bool(ok), detail))
        print(f"  [{'OK  ' if ok else 'FAIL'}] {what}" + (f"  ({detail[:300]})" if detail and not ok else ""), flush=True)
        return bool(ok)

    def note(self, task: str, what: str, detail: str) -> None:
        self.rows.append(Check(task, what, None, detail))
        print(f"  [NOTE] {what}: {detail}", flush=True)

    def of(self, task: str) -> list[Check]:
        return [r for r in self.rows if r.task == task and r.ok is not None]


# --- bytes ------------------------------------------------------------------------------------------


def sha256(*parts: bytes) -> bytes:
    h = hashlib.sha256()
    for p in parts:
        h.update(p)
    return h.digest()


def hx(b: bytes) -> str:
    return "0x" + b.hex()


def unhex(s: str) -> bytes:
    if not s.startswith("0x"):
        raise ValueError(f"not 0x hex: {s!r}")
    return bytes.fromhex(s[2:])


def u32(n: int) -> bytes:
    return n.to_bytes(4, "big")


def u64(n: int) -> bytes:
    return n.to_bytes(8, "big")


def lp(task_id: str) -> bytes:
    """storage.md "Column families and key formats": one length byte, then the ASCII task_id."""
    b = task_id.encode("ascii")
    return bytes([len(b)]) + b


def fp32_bytes(flat: np.ndarray) -> bytes:
    return np.ascontiguousarray(flat, dtype="<f4").tobytes()


# --- the store (storage.md "Column families and key formats", node.md "What is stored where") -------


REF_MAGIC = b"\xff\xff\xff\xff" + b"tenzro:external"  # storage.md 'Large values'
FILE_MAGIC = bytes.fromhex("545a585600010000")


class Store:
    def __init__(self, path: str) -> None:
        from rocksdict import AccessType, Options, Rdict

        families = Rdict.list_cf(path, Options(raw_mode=True))
        self.db = Rdict(path, options=Options(raw_mode=True), access_type=AccessType.read_only(),
                        column_families={c: Options(raw_mode=True) for c in families})
        self.cf = {c: self.db.get_column_family(c) for c in families}
        self.values_dir = os.path.join(path, "values")

    def _value(self, family: str, key: bytes, stored: bytes) -> bytes:
        """storage.md 'Large values': payload keys of submissions and every model_state key may
        hold a 43-byte reference to a file of values/ instead of the value."""
        external = len(key) <= 65535 and (family == "model_state" or (family == "submissions" and key[:1] == b"\x00"))
        if not (external and len(stored) == 43 and stored.startswith(REF_MAGIC)):
            return stored
        name, size = stored[19:35], int.from_bytes(stored[35:43], "big")
        with open(os.path.join(self.values_dir, name.hex()), "rb") as fh:
            data = fh.read()
        family_bytes = family.encode()
        header = FILE_MAGIC + bytes([len(family_bytes)]) + family_bytes + len(key).to_bytes(2, "big") + key
        if not data.startswith(header) or len(data) - len(header) != size:
            raise ValueError(f"value file {name.hex()} of {family} is not this key's value")
        return data[len(header):]

    def get(self, family: str, key: bytes) -> bytes | None:
        stored = self.cf[family].get(key)
        return None if stored is None else self._value(family, key, stored)

    def items(self, family: str, prefix: bytes = b"") -> Iterator[tuple[bytes, bytes]]:
        for k, v in self.cf[family].items():
            if k.startswith(prefix):
                yield k, self._value(family, k, v)

    def close(self) -> None:
        for c in self.cf.values():
            c.close()
        self.db.close()


def submission_key(task_id: str, rnd: int, fragment: int, trainer: bytes) -> bytes:
    return lp(task_id) + u32(rnd) + u32(fragment) + trainer


def payload_key(task_id: str, payload_hash: bytes) -> bytes:
    return b"\x00" + lp(task_id) + payload_hash


def model_key(task_id: str, kind: bytes, fragment: int) -> bytes:
    return lp(task_id) + kind + u32(fragment)


def meta_key(task_id: str, kind: bytes, rnd: int | None = None) -> bytes:
    return b"T" + lp(task_id) + kind + (b"" if rnd is None else u32(rnd))


# --- tensors and fragments (fragments.md) ----------------------------------------------------------

DTYPE_TAG = {"float32": 1, "float16": 2, "bfloat16": 3}
ST_DTYPE = {"F32": "float32", "F16": "float16", "BF16": "bfloat16"}
ITEMSIZE = {"float32": 4, "float16": 2, "bfloat16": 2}

State = dict[str, tuple[tuple[int, ...], np.ndarray]]  # name -> (shape, flat fp32 values)


@dataclass(frozen=True)
class Entry:
    name: str
    shape: tuple[int, ...]
    dtype: str
    start: int
    stop: int

    @property
    def whole(self) -> bool:
        return self.start == 0 and self.stop == numel(self.shape)


@dataclass(frozen=True)
class Layout:
    index: int
    entries: tuple[Entry, ...]

    @property
    def numel(self) -> int:
        return sum(e.stop - e.start for e in self.entries)


def numel(shape: tuple[int, ...]) -> int:
    return math.prod(shape)


def by_utf8(name: str) -> bytes:
    return name.encode("utf-8")


def widen_to_fp32(raw: bytes, dtype: str) -> np.ndarray:
    """payload.md step 13 / node.md "Init checkpoints": fp16 and bf16 widen exactly to fp32."""
    if dtype == "float32":
        return np.frombuffer(raw, dtype="<f4").astype(f32)
    if dtype == "float16":
        return np.frombuffer(raw, dtype="<f2").astype(f32)
    if dtype == "bfloat16":
        return (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << np.uint32(16)).view(f32).copy()
    raise ValueError(dtype)


def tensor_header(name: str, dtype: str, shape: tuple[int, ...]) -> bytes:
    """fragments.md "Tensor header and tensor record"."""
    nb = name.encode("utf-8")
    return u64(len(nb)) + nb + bytes([DTYPE_TAG[dtype]]) + u64(len(shape)) + b"".join(u64(d) for d in shape)


def model_hash(state: State) -> bytes:
    """fragments.md "Global model hash": over the fp32 state (tag 0x01, "What the node hashes")."""
    names = sorted(state, key=by_utf8)
    h = hashlib.sha256(b"tenzro/train/model/v1" + u64(len(names)))
    for n in names:
        shape, flat = state[n]
        h.update(tensor_header(n, "float32", shape))
        h.update(fp32_bytes(flat))
    return h.digest()


def split_fragments(tensors: list[tuple[str, tuple[int, ...], str]], count: int) -> list[Layout]:
    """fragments.md "The split rule"."""
    nonempty = [t for t in sorted(tensors, key=lambda t: by_utf8(t[0])) if numel(t[1]) > 0]
    total = sum(numel(t[1]) for t in nonempty)
    if count < 1 or total == 0 or count > total:
        raise ValueError(f"cannot split {total} elements into {count} fragments")
    q, r = divmod(total, count)
    layouts, offset = [], 0
    starts = []
    for t in nonempty:
        starts.append(offset)
        offset += numel(t[1])
    for i in range(count):
        a = i * q + min(i, r)
        b = a + (q + 1 if i < r else q)
        entries = []
        for (name, shape, dtype), so in zip(nonempty, starts):
            lo, hi = max(a, so), min(b, so + numel(shape))
            if lo < hi:
                entries.append(Entry(name, tuple(shape), dtype, lo - so, hi - so))
        layouts.append(Layout(i, tuple(entries)))
    return layouts


def layout_hash(layout: Layout) -> bytes:
    """fragments.md "Layout hash"."""
    b = b"tenzro/train/fragment-layout/v1" + u64(layout.index) + u64(len(layout.entries))
    for e in layout.entries:
        b += tensor_header(e.name, e.dtype, e.shape) + u64(e.start) + u64(e.stop)
    return sha256(b)


def aggregate_hash(lh: bytes, flat: np.ndarray) -> bytes:
    """fragments.md "Aggregate hash"."""
    return sha256(b"tenzro/train/aggregate/v1", lh, fp32_bytes(flat))


def gather(state: State, layout: Layout) -> np.ndarray:
    """fragments.md "Gather and scatter"."""
    parts = [state[e.name][1][e.start:e.stop] for e in layout.entries]
    return np.concatenate(parts).astype(f32) if parts else np.zeros(0, f32)


def scatter(state: State, layout: Layout, flat: np.ndarray) -> None:
    o = 0
    for e in layout.entries:
        state[e.name][1][e.start:e.stop] = flat[o:o + e.stop - e.start]
        o += e.stop - e.start


# --- safetensors files: checkpoints (node.md "Init checkpoints"), final model (node.md "What is stored where")


def read_safetensors(data: bytes) -> tuple[dict[str, str] | None, dict[str, tuple[str, tuple[int, ...], bytes]]]:
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n].decode("utf-8"))
    meta = header.pop("__metadata__", None)
    base = 8 + n
    tensors = {}
    for name, t in header.items():
        b, e = t["data_offsets"]
        tensors[name] = (ST_DTYPE[t["dtype"]], tuple(t["shape"]), data[base + b:base + e])
    return meta, tensors


def fp32_state(tensors: dict[str, tuple[str, tuple[int, ...], bytes]]) -> State:
    return {name: (shape, widen_to_fp32(raw, dt)) for name, (dt, shape, raw) in tensors.items()}


def model_file_bytes(state: State, metadata: dict[str, str]) -> bytes:
    """node.md "What is stored where": the final model file, byte for byte."""
    names = sorted(state, key=by_utf8)
    header: dict[str, Any] = {"__metadata__": metadata}
    offset = 0
    for n in names:
        shape, flat = state[n]
        header[n] = {"data_offsets": [offset, offset + 4 * flat.size], "dtype": "F32", "shape": list(shape)}
        offset += 4 * flat.size
    hb = json.dumps(header, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode("ascii")
    hb += b" " * (-len(hb) % 8)
    return struct.pack("<Q", len(hb)) + hb + b"".join(fp32_bytes(state[n][1]) for n in names)


# --- payloads (payload.md "Format", "Decoding: what is checked, in order") -------------------------


def reject_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    keys = [k for k, _ in pairs]
    if len(keys) != len(set(keys)):
        raise ValueError("duplicate JSON key")
    return dict(pairs)


def payload_tensor_name(e: Entry) -> str:
    return e.name if e.whole else f"{e.name}#{e.start}:{e.stop}"


def payload_encoding(spec: dict[str, Any]) -> tuple[str, int] | None:
    """payload.md "Encodings" and spec.md "Metadata": ``architecture.metadata.outer_gradient_encoding``
    selects the run's encoding: absent or ``"raw"`` (raw only: None), ``{"topk": {"density_bps": N}}``
    with 1 <= N <= 5000 (topk and raw: ("topk", N)) or ``{"q8": {"block_size": B}}`` with
    16 <= B <= 65536 (q8 and raw: ("q8", B)); each optionally with ``"feedback_decay": D``, a number
    in 0..1 that only the trainers use. Anything else raises ValueError."""
    md = spec["architecture"]["metadata"]
    if "outer_gradient_encoding" not in md:
        return None
    value = md["outer_gradient_encoding"]
    if value == "raw":
        return None
    bounds = {"topk": ("density_bps", 1, 5000), "q8": ("block_size", 16, 65536)}
    if isinstance(value, dict) and len(value) == 1 and list(value)[0] in bounds and isinstance(list(value.values())[0], dict):
        name, inner = list(value.items())[0]
        param, low, high = bounds[name]
        decay = inner.get("feedback_decay", 0)
        if set(inner) <= {param, "feedback_decay"} and param in inner and isinstance(inner[param], int) \
                and not isinstance(inner[param], bool) and low <= inner[param] <= high \
                and isinstance(decay, (int, float)) and not isinstance(decay, bool) and 0 <= decay <= 1:
            return name, inner[param]
    raise ValueError(f"outer_gradient_encoding {value!r}")


def topk_kept(numel: int, density_bps: int | None) -> int | None:
    """payload.md "topk": a fragment of ``numel`` values sends k = ceil(numel * density_bps / 10000)."""
    return None if density_bps is None else -(-numel * density_bps // 10000)


def same_json(a: Any, b: Any) -> bool:
    """Equal as JSON values, telling 0 from 0.0 and 1 from true."""
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


def decode_payload(data: bytes, layout: Layout, *, task_id: str, rnd: int, lh: bytes, topk_k: int | None = None,
                   q8_block: int | None = None, max_abs: float = 1e6) -> np.ndarray:
    """payload.md "Decoding": one payload to the fragment's dense fp32 vector. ``topk_k``: the run's
    k for this fragment (payload.md "topk"); ``q8_block``: the run's block size (payload.md "q8");
    both None means the run accepts raw payloads only."""
    n = struct.unpack("<Q", data[:8])[0]
    if 8 + n > len(data) or data[8:9] != b"{":
        raise ValueError("truncated payload or not a JSON header")
    header = json.loads(data[8:8 + n].decode("utf-8"), object_pairs_hook=reject_duplicate_keys)
    meta = header.pop("__metadata__")
    encoding = meta.get("tenzro.encoding")
    accepted = ["raw"] + (["topk"] if topk_k is not None else []) + (["q8"] if q8_block is not None else [])
    if encoding not in accepted:
        # payload.md "Encodings": raw is always accepted, topk or q8 only in a run that selects it.
        raise ValueError(f"payload encoding {encoding!r} in a run that accepts {', '.join(accepted)}")
    want = {"tenzro.version": "1", "tenzro.task_id": task_id, "tenzro.round": str(rnd),
            "tenzro.fragment": str(layout.index), "tenzro.encoding": encoding, "tenzro.layout_hash": hx(lh)}
    if set(meta) != set(want) | {"tenzro.dtype"} or any(meta[k] != v for k, v in want.items()):
        raise ValueError(f"payload metadata {meta}")
    dtype = meta["tenzro.dtype"]
    st_name = {v: k for k, v in ST_DTYPE.items()}[dtype]
    body = data[8 + n:]
    if encoding == "topk":
        assert topk_k is not None
        flat = decode_topk(body, header, layout, dtype, st_name, topk_k)
    elif encoding == "q8":
        assert q8_block is not None
        flat = decode_q8(body, header, layout, dtype, st_name, q8_block)
    else:
        flat = decode_raw(body, header, layout, dtype, st_name)
    if not np.all(np.isfinite(flat)) or (flat.size and float(np.max(np.abs(flat))) > max_abs):
        raise ValueError("payload value non-finite or out of range")
    return flat


def decode_raw(body: bytes, header: dict[str, Any], layout: Layout, dtype: str, st_name: str) -> np.ndarray:
    """payload.md "Format" and decoding steps 10-13: one tensor per layout entry, tiling the data."""
    expected = {payload_tensor_name(e): ([*e.shape] if e.whole else [e.stop - e.start], e.stop - e.start)
                for e in layout.entries}
    if set(header) != set(expected):
        raise ValueError("payload tensor names differ from the layout")
    spans = []
    for name, t in header.items():
        shape, count = expected[name]
        if set(t) != {"dtype", "shape", "data_offsets"} or t["dtype"] != st_name or t["shape"] != shape:
            raise ValueError(f"payload tensor {name}")
        b, e = t["data_offsets"]
        if e - b != count * ITEMSIZE[dtype]:
            raise ValueError(f"payload tensor {name} size")
        spans.append((b, e))
    pos = 0
    for b, e in sorted(spans):
        if b != pos:
            raise ValueError("payload data has a hole or an overlap")
        pos = e
    if pos != len(body):
        raise ValueError("payload data truncated or trailing bytes")
    parts = []
    for e in layout.entries:
        b, end = header[payload_tensor_name(e)]["data_offsets"]
        parts.append(widen_to_fp32(body[b:end], dtype))
    return np.concatenate(parts).astype(f32) if parts else np.zeros(0, f32)


def decode_topk(body: bytes, header: dict[str, Any], layout: Layout, dtype: str, st_name: str, k: int) -> np.ndarray:
    """payload.md "topk": exactly the tensors ``indices`` (U32, [k], at [0, 4k]) and ``values`` (the
    declared dtype, [k], right after), nothing else in the data; the indices strictly ascending and
    below the fragment's element count; then zeros with each value, widened exactly, at its index."""
    values_end = 4 * k + k * ITEMSIZE[dtype]
    want = {"indices": {"dtype": "U32", "shape": [k], "data_offsets": [0, 4 * k]},
            "values": {"dtype": st_name, "shape": [k], "data_offsets": [4 * k, values_end]}}
    if not same_json(header, want):
        raise ValueError(f"topk payload tensors {json.dumps(header)[:200]} (want k={k})")
    if len(body) != values_end:
        raise ValueError(f"topk payload data is {len(body)} bytes, not {values_end}")
    indices = np.frombuffer(body[:4 * k], dtype="<u4").astype(np.int64)
    values = widen_to_fp32(body[4 * k:], dtype)
    if k and (int(indices[-1]) >= layout.numel or not bool(np.all(indices[1:] > indices[:-1]))):
        raise ValueError(f"topk indices not strictly ascending within 0..{layout.numel - 1}")
    if MUTATE == "topk_reversed":
        values = values[::-1]
    if MUTATE == "topk_drop_one":
        indices, values = indices[:-1], values[:-1]
    flat = np.zeros(layout.numel, f32)
    flat[indices] = values
    return flat


def decode_q8(body: bytes, header: dict[str, Any], layout: Layout, dtype: str, st_name: str, block: int) -> np.ndarray:
    """payload.md "q8": exactly the tensors ``scales`` (the declared dtype, [m], at 0) and ``values``
    (I8, [n], right after), m = ceil(n / B), nothing else in the data; every scale finite and not
    negative, every value in -127..127; value i decodes as float32(values[i]) * float32(scales[i // B])
    in binary32, round to nearest even."""
    n = layout.numel
    m = (n + block - 1) // block
    scales_end = m * ITEMSIZE[dtype]
    want = {"scales": {"dtype": st_name, "shape": [m], "data_offsets": [0, scales_end]},
            "values": {"dtype": "I8", "shape": [n], "data_offsets": [scales_end, scales_end + n]}}
    if not same_json(header, want):
        raise ValueError(f"q8 payload tensors {json.dumps(header)[:200]} (want B={block})")
    if len(body) != scales_end + n:
        raise ValueError(f"q8 payload data is {len(body)} bytes, not {scales_end + n}")
    scales = widen_to_fp32(body[:scales_end], dtype)
    values = np.frombuffer(body[scales_end:], dtype=np.int8)
    if not bool(np.all(np.isfinite(scales))) or bool(np.any(scales < 0)):
        raise ValueError("q8 scale non-finite or negative")
    if n and int(values.min()) == -128:
        raise ValueError("q8 value -128")
    if MUTATE == "q8_unsigned":
        values = values.view(np.uint8)
    if MUTATE == "q8_scale_per_tensor":
        scales = np.full(m, scales.max() if m else 0, f32)
    out = np.empty(n, f32)
    with np.errstate(over="ignore"):  # an Inf product is refused by the caller's finiteness check
        for b in range(m):  # block by block, as the doc states it
            lo, hi = b * block, min(n, (b + 1) * block)
            out[lo:hi] = values[lo:hi].astype(f32) * scales[b]
    return out


# --- aggregation (aggregation.md "Pinned arithmetic", "The report") --------------------------------


@dataclass
class Aggregate:
    values: np.ndarray
    trimmed: int = 0
    selected: int | None = None
    scores: list[float] | None = None


def rule_of(agg: Any) -> tuple[int, int]:
    """spec.md "Aggregation": (RuleKind wire code, parameter)."""
    if agg == "Mean":
        return 0, 0
    if agg == "CoordinateMedian":
        return 2, 0
    if isinstance(agg, dict) and set(agg) == {"TrimmedMean"}:
        return 1, agg["TrimmedMean"]["alpha_bps"]
    if isinstance(agg, dict) and set(agg) == {"Krum"} and set(agg["Krum"]) == {"f"}:
        return 3, agg["Krum"]["f"]
    raise ValueError(f"rule not covered by this verifier: {agg!r}")


def left_to_right_sum(rows: Any) -> np.ndarray:
    acc = rows[0].astype(f32)
    for row in rows[1:]:
        acc = (acc + row).astype(f32)
    return acc


def mean(xs: list[np.ndarray]) -> Aggregate:
    if MUTATE == "numpy_mean":
        return Aggregate(np.mean(np.stack(xs), axis=0, dtype=f32))
    return Aggregate((left_to_right_sum(xs) / f32(len(xs))).astype(f32))


def plus_zero(v: np.ndarray) -> np.ndarray:
    """aggregation.md "Zeros": CoordinateMedian and TrimmedMean add +0.0 at the end."""
    return v if MUTATE == "no_plus_zero" else (v + f32(0)).astype(f32)


def coordinate_median(xs: list[np.ndarray]) -> Aggregate:
    s, k = np.sort(np.stack(xs), axis=0), len(xs)
    if k % 2:
        return Aggregate(plus_zero(s[k // 2]))
    a, b = s[k // 2 - 1], s[k // 2]
    if MUTATE == "median_f32":
        return Aggregate(plus_zero(((a + b) / f32(2)).astype(f32)))
    total = a.astype(f64) + b.astype(f64)
    return Aggregate(plus_zero((total * 0.5).astype(f32)))


def trimmed_mean(xs: list[np.ndarray], alpha_bps: int) -> Aggregate:
    k = len(xs)
    t = (k * alpha_bps) // 10000
    kept = np.sort(np.stack(xs), axis=0)[t:k - t]
    return Aggregate(plus_zero((left_to_right_sum(kept) / f32(k - 2 * t)).astype(f32)), trimmed=t)


GRAM_BLOCK, GRAM_BITS = 512, 22


def krum_quantize(block: np.ndarray) -> np.ndarray:
    """aggregation.md Krum step 2: round to multiples of 2^(e - 22), e from the largest exponent."""
    if MUTATE == "krum_plain_f64":
        return block.astype(f64)
    biggest = float(np.max(np.abs(block))) if block.size else 0.0
    e = -126 if biggest == 0.0 else max(math.frexp(biggest)[1], -126)
    g = e - GRAM_BITS
    return np.rint(block.astype(f64) * 2.0 ** -g) * 2.0 ** g


def exact_block_gram(q: np.ndarray) -> np.ndarray:
    """Krum step 3: every sum is exact in float64, so plain fsum gives the pinned value."""
    k = q.shape[0]
    g = np.zeros((k, k), f64)
    for i in range(k):
        for j in range(k):
            g[i, j] = math.fsum((q[i] * q[j]).tolist()) + 0.0
    return g


def krum_distances(xs: list[np.ndarray]) -> np.ndarray:
    k, n = len(xs), xs[0].size
    grams = []
    for b in range(max(1, -(-n // GRAM_BLOCK))):
        rows = []
        for x in xs:
            block = np.zeros(GRAM_BLOCK, f32)
            seg = x[b * GRAM_BLOCK:(b + 1) * GRAM_BLOCK]
            block[:seg.size] = seg
            rows.append(krum_quantize(block))
        grams.append(exact_block_gram(np.stack(rows)))
    p = 1 << (len(grams) - 1).bit_length()  # step 4: tree sum over a power of two
    grams += [np.zeros((k, k), f64)] * (p - len(grams))
    while p > 1:
        p //= 2
        grams = [grams[b] + grams[b + p] for b in range(p)]
    g = grams[0]
    d = np.zeros((k, k), f64)
    for i in range(k):  # step 5
        for j in range(k):
            v = (g[i, i] + g[j, j]) - 2 * g[i, j]
            d[i, j] = v if v > 0 else 0.0
    return d


def krum(xs: list[np.ndarray], f: int) -> Aggregate:
    k = len(xs)
    d = krum_distances(xs)
    scores = []
    for i in range(k):  # step 6
        score = 0.0
        for v in sorted(d[i, j] for j in range(k) if j != i)[:k - f - 2]:
            score = score + v
        scores.append(score)
    selected = min(range(k), key=lambda i: (scores[i], i))  # step 7
    return Aggregate(xs[selected].copy(), selected=selected, scores=scores)


def aggregate(agg: Any, xs: list[np.ndarray]) -> Aggregate:
    kind, param = rule_of(agg)
    if MUTATE == "reverse_order":
        xs = xs[::-1]
    if kind == 0:
        return mean(xs)
    if kind == 1:
        return trimmed_mean(xs, param)
    if kind == 2:
        return coordinate_median(xs)
    return krum(xs, param)


def report_bytes(agg: Any, k: int, out: Aggregate) -> bytes:
    """aggregation.md "The report": RFC 8785, Krum scores as binary64 hex."""
    scores = None if out.scores is None else ["0x" + struct.pack(">d", s).hex() for s in out.scores]
    return rfc8785.dumps({"domain": "tenzro/train/aggregation-report/v1", "k": k, "rule": agg, "scores": scores,
                          "selected": out.selected, "selected_set": None, "trimmed_per_side": out.trimmed})


# --- outer step (lifecycle.md "Outer step") ---------------------------------------------------------


def outer_step(w: np.ndarray, b: np.ndarray, g: np.ndarray, lr: np.float32, mu: np.float32) -> tuple[np.ndarray, np.ndarray]:
    if MUTATE == "outer_f64":
        b2 = f64(mu) * b + g
        return (w - f64(lr) * (g + f64(mu) * b2)).astype(f32), b2.astype(f32)
    m = (mu * b).astype(f32)
    b2 = (m + g).astype(f32)
    n = (mu * b2).astype(f32)
    d = (g + n).astype(f32)
    s = (lr * d).astype(f32)
    return (w - s).astype(f32), b2


# --- records and the run root (records.md "Leaf encodings", merkle.md) ------------------------------

ROUND_TYPES = ["uint8", "uint16", "string", "uint64", "address", "uint32", "uint8", "uint32",
               "(bytes32,address[],uint32,uint32,bytes32)[]", "bytes32"]
FINAL_TYPES = ["uint8", "uint16", "string", "uint64", "bytes32"]


def round_record_leaf(rec: dict[str, Any]) -> bytes:
    frags = [(unhex(fr["aggregate_hash"]), [to_checksum_address(a) for a in fr["accepted"]], fr["selected"],
              fr["trimmed"], unhex(fr["report_hash"])) for fr in rec["fragments"]]
    return abi_encode(ROUND_TYPES, [1, 1, rec["task_id"], rec["round"], to_checksum_address(rec["syncer"]),
                                    rec["syncer_rank"], rec["rule_kind"], rec["rule_param"], frags,
                                    unhex(rec["model_hash"])])


def final_record_leaf(task_id: str, rounds: int, final_hash: bytes) -> bytes:
    return abi_encode(FINAL_TYPES, [2, 1, task_id, rounds, final_hash])


def split_point(n: int) -> int:
    """merkle.md "Tree hash": the largest power of two smaller than n."""
    k = 1
    while k * 2 < n:
        k *= 2
    return k


def mth(leaves: list[bytes]) -> bytes:
    if not leaves:
        return sha256(b"")
    if len(leaves) == 1:
        return sha256(b"\x00", leaves[0])
    k = split_point(len(leaves))
    return sha256(b"\x01", mth(leaves[:k]), mth(leaves[k:]))


def run_root(leaves: list[bytes]) -> bytes:
    """merkle.md "Run root"."""
    return sha256(b"tenzro/train/run-root/v1", mth(leaves))


def audit_path(leaves: list[bytes], m: int) -> list[bytes]:
    if len(leaves) <= 1:
        return []
    k = split_point(len(leaves))
    if m < k:
        return audit_path(leaves[:k], m) + [mth(leaves[k:])]
    return audit_path(leaves[k:], m - k) + [mth(leaves[:k])]


def verify_inclusion(leaf: bytes, index: int, size: int, proof: list[bytes], root: bytes) -> bool:
    """merkle.md "Audit paths": the verification pseudo-code."""
    if index >= size:
        return False
    fn, sn, r = index, size - 1, sha256(b"\x00", leaf)
    for p in proof:
        if sn == 0:
            return False
        if fn & 1 or fn == sn:
            r = sha256(b"\x01", p, r)
            while not fn & 1 and fn != 0:
                fn >>= 1
                sn >>= 1
        else:
            r = sha256(b"\x01", r, p)
        fn >>= 1
        sn >>= 1
    return sn == 0 and r == root


# --- receipt and money (receipt.md "ABI (version 1)", "Receipt size"; ledger.md "Payouts") ----------

RECEIPT_TYPE = ("(uint16,string,bytes,address,uint256,bytes32,bytes32,bytes[],"
                "(address,uint256,uint256,string,bool)[],address[],uint64)")


def word_pad(n: int) -> int:
    return -(-n // 32) * 32


def compute_payouts(pool: int, weights: dict[bytes, int]) -> tuple[dict[bytes, int], int]:
    total = sum(weights.values())
    pay = {a: (0 if total == 0 else pool * w // total) for a, w in sorted(weights.items())}
    return pay, pool - sum(pay.values())


# --- one run ----------------------------------------------------------------------------------------


@dataclass
class Run:
    """What the checks of one run share: inputs read from the store, values recomputed so far."""

    task_id: str
    store: Store
    res: Results
    raw_state: bytes
    state: dict[str, Any]
    receipt: dict[str, Any] | None
    run_view: dict[str, Any] | None
    receipt_doc: dict[str, Any] | None
    data_dir: Path | None
    spec_canonical: bytes = b""
    model: State = field(default_factory=dict)
    layouts: list[Layout] = field(default_factory=list)
    layout_hashes: list[bytes] = field(default_factory=list)
    topk_k: list[int | None] = field(default_factory=list)
    q8_block: int | None = None
    leaves: list[bytes] = field(default_factory=list)
    accepted_counts: dict[bytes, int] = field(default_factory=dict)
    final_hash: bytes = b""
    root: bytes = b""
    abi: bytes = b""

    @property
    def spec(self) -> dict[str, Any]:
        return self.state["spec"]

    def check(self, what: str, ok: bool, detail: str = "") -> bool:
        return self.res.check(self.task_id, what, ok, detail)

    def note(self, what: str, detail: str) -> None:
        self.res.note(self.task_id, what, detail)


def canonical_json(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def check_stored_form(run: Run, stored: dict[str, Any], record_values: list[bytes]) -> None:
    run.check("node.md 'What is stored where': RunState JSON has sorted keys, no spaces, ASCII",
              run.raw_state == canonical_json(stored))
    run.check("node.md 'What is stored where': each round record's JSON has sorted keys, no spaces, ASCII",
              all(v == canonical_json(json.loads(v)) for v in record_values))


def check_spec_and_seed(run: Run) -> None:
    run.spec_canonical = rfc8785.dumps(run.spec)
    spec_hash = sha256(run.spec_canonical)
    run.check("spec.md 'Canonical form and hashing': spec_hash = SHA-256(RFC 8785 of the spec)",
              hx(spec_hash) == run.state["spec_hash"], f"{hx(spec_hash)} vs {run.state['spec_hash']}")
    if run.run_view is not None:
        run.check("spec.md: getRun spec_hash", hx(spec_hash) == run.run_view["spec_hash"])
    seed = sha256(b"tenzro/train/syncer-election/v1", run.task_id.encode(), spec_hash)
    committed = ((run.run_view or {}).get("election") or {}).get("seed") or \
        (((run.receipt_doc or {}).get("attestations") or {}).get("election") or {}).get("seed")
    if committed is None:
        run.note("election seed", "not in the stored run state (lifecycle.md 'Stored form and view'); needs getRun")
    else:
        run.check("election.md 'Seed': SHA-256(domain || task_id || spec_hash)", hx(seed) == committed, committed)


def checkpoint_path(run: Run, ckpt_dir: str | None) -> Path:
    path = Path(unquote(urlparse(run.spec["architecture"]["metadata"]["init_checkpoint"]["uri"]).path))
    if not path.exists() and ckpt_dir:
        path = Path(ckpt_dir) / path.name  # a moved checkpoint; its SHA-256 is still checked
    return path


def check_initial_model(run: Run, ckpt_dir: str | None) -> None:
    """node.md 'Init checkpoints' + fragments.md: widen to fp32, then split and hash."""
    data = checkpoint_path(run, ckpt_dir).read_bytes()
    pinned = run.spec["architecture"]["metadata"]["init_checkpoint"]["sha256"]
    run.check("node.md 'Init checkpoints': checkpoint SHA-256 = the spec's", hx(sha256(data)) == pinned)
    _meta, tensors = read_safetensors(data)
    run.model = fp32_state(tensors)
    fp32_specs = [(n, shape, "float32") for n, (shape, _v) in run.model.items()]
    run.layouts = split_fragments(fp32_specs, run.spec["architecture"]["fragment_count"])
    run.layout_hashes = [layout_hash(lay) for lay in run.layouts]
    stored = run.store.get("meta", meta_key(run.task_id, b"s"))
    if stored is not None:
        want = [[n, list(s), d] for n, s, d in sorted(fp32_specs, key=lambda t: by_utf8(t[0]))]
        run.check("node.md 'What is stored where': tensor_specs_key lists the fp32 tensors",
                  json.loads(stored).get("tensors") == want, stored[:200].decode(errors="replace"))
    init = model_hash(run.model)
    run.check("fragments.md 'What the node hashes': initial model hash of the fp32-widened checkpoint",
              hx(init) == run.state["initial_model_hash"], f"{hx(init)} vs {run.state['initial_model_hash']}")


def view_entries(fragment: dict[str, Any]) -> list[Entry]:
    return [Entry(e["name"], tuple(e["shape"]), e["dtype"], e["start"], e["stop"]) for e in fragment["entries"]]


def check_run_view_layouts(run: Run) -> None:
    if run.run_view is None:
        run.note("getRun layouts", "no getRun answer (--json-dir or --rpc)")
        return
    ok = all(fr["layout_hash"] == hx(run.layout_hashes[i]) and fr["numel"] == run.layouts[i].numel
             and view_entries(fr) == list(run.layouts[i].entries) for i, fr in enumerate(run.run_view["fragments"]))
    run.check(f"fragments.md 'The split rule', 'Layout hash': getRun fragments (F={len(run.layouts)})",
              ok and len(run.run_view["fragments"]) == len(run.layouts))
    empties = sorted(({"name": n, "shape": list(s)} for n, (s, _v) in run.model.items() if numel(s) == 0),
                     key=lambda d: by_utf8(d["name"]))
    run.check("fragments.md 'The split rule' step 2: getRun empty_tensors", run.run_view["empty_tensors"] == empties,
              str(run.run_view["empty_tensors"]))


def stored_weights_match(run: Run, weights: list[np.ndarray], momentum: list[np.ndarray] | None, kind: bytes) -> bool:
    for i, w in enumerate(weights):
        if run.store.get("model_state", model_key(run.task_id, kind, i)) != fp32_bytes(w):
            return False
        if momentum is not None and run.store.get("model_state", model_key(run.task_id, b"m", i)) != fp32_bytes(momentum[i]):
            return False
    return True


def round_inputs(run: Run, rnd: int, fragment: int, accepted: list[bytes]) -> list[np.ndarray]:
    """storage.md: the inputs are the payloads of the record's `accepted` trainers, in that order."""
    xs = []
    for trainer in accepted:
        record = run.store.get("submissions", submission_key(run.task_id, rnd, fragment, trainer))
        if record is None or len(record) != 98 or record[0] != 1:
            raise ValueError(f"round {rnd} fragment {fragment}: submission record of {hx(trainer)} missing or malformed")
        payload_hash = record[1:33]
        payload = run.store.get("submissions", payload_key(run.task_id, payload_hash))
        if payload is None or sha256(payload) != payload_hash:
            raise ValueError(f"round {rnd} fragment {fragment}: payload of {hx(trainer)} missing or not its hash")
        xs.append(decode_payload(payload, run.layouts[fragment], task_id=run.task_id, rnd=rnd,
                                 lh=run.layout_hashes[fragment], topk_k=run.topk_k[fragment],
                                 q8_block=run.q8_block))
        run.accepted_counts[trainer] = run.accepted_counts.get(trainer, 0) + 1
    return xs


def check_fragment_outcome(run: Run, rnd: int, i: int, fr: dict[str, Any], stored_reports: list[Any] | None) -> np.ndarray:
    accepted = [unhex(a) for a in fr["accepted"]]
    run.check(f"r{rnd} f{i}: records.md 'Field rules': accepted strictly ascending, quorum <= K <= M",
              accepted == sorted(set(accepted)) and run.spec["quorum"] <= len(accepted) <= run.spec["trainer_count"])
    xs = round_inputs(run, rnd, i, accepted)
    out = aggregate(run.spec["aggregation"], xs)
    ah = aggregate_hash(run.layout_hashes[i], out.values)
    run.check(f"r{rnd} f{i}: aggregation.md 'Pinned arithmetic' -> aggregate hash (K={len(xs)})",
              hx(ah) == fr["aggregate_hash"], f"{hx(ah)} vs {fr['aggregate_hash']}")
    run.check(f"r{rnd} f{i}: aggregation.md 'The report': trimmed={out.trimmed} selected={out.selected or 0}",
              fr["trimmed"] == out.trimmed and fr["selected"] == (out.selected or 0), f"{fr['trimmed']} {fr['selected']}")
    report = report_bytes(run.spec["aggregation"], len(xs), out)
    run.check(f"r{rnd} f{i}: aggregation.md 'The report': report hash", hx(sha256(report)) == fr["report_hash"],
              report.decode()[:300])
    if stored_reports is not None:
        run.check(f"r{rnd} f{i}: node.md 'What is stored where': stored report bytes",
                  rfc8785.dumps(stored_reports[i]) == report)
    return out.values


def check_rounds(run: Run) -> None:
    spec = run.spec
    kind, param = rule_of(spec["aggregation"])
    md = spec["architecture"]["metadata"]
    lr, mu = f32(md.get("outer_lr", 0.7)), f32(md.get("outer_momentum", 0.9))  # lifecycle.md "Outer step"
    try:
        selected = payload_encoding(spec)
        run.check("payload.md 'Encodings': outer_gradient_encoding absent, \"raw\", topk with 1 <= density_bps <= 5000"
                  " or q8 with 16 <= block_size <= 65536"
                  + ("" if selected is None else f" ({selected[0]} {selected[1]})"), True,
                  repr(md.get("outer_gradient_encoding")))
    except ValueError:
        # payload.md "Encodings": a stored run's value that does not parse (posted before the key
        # existed, when metadata was free-form) means raw only.
        selected = None
        run.note("payload.md 'Encodings'", f"outer_gradient_encoding {md.get('outer_gradient_encoding')!r} does not "
                                           "parse: read as raw only (a run posted before the key existed)")
    density = selected[1] if selected is not None and selected[0] == "topk" else None
    run.topk_k = [topk_kept(lay.numel, density) for lay in run.layouts]
    run.q8_block = selected[1] if selected is not None and selected[0] == "q8" else None
    weights = [gather(run.model, lay) for lay in run.layouts]
    momentum = [np.zeros(lay.numel, f32) for lay in run.layouts]
    snap = run.store.get("meta", meta_key(run.task_id, b"n"))
    snapshot_rounds = int.from_bytes(snap, "big") if snap else None
    if snapshot_rounds == 0:
        run.check("node.md 'Model state': stored round-0 snapshot = widened checkpoint, no momentum (zero)",
                  stored_weights_match(run, weights, None, b"w")
                  and all(run.store.get("model_state", model_key(run.task_id, b"m", i)) is None
                          for i in range(len(run.layouts))))
    records = run.state["records"]
    run.check("lifecycle.md 'Stored form and view': one record per round, max_rounds of them",
              len(records) == spec["max_rounds"])
    run.leaves = [run.spec_canonical]
    run.final_hash = unhex(run.state["initial_model_hash"])
    for rnd, rec in enumerate(records):
        run.check(f"r{rnd}: records.md 'Field rules': task, round, rule, fragment count",
                  rec["task_id"] == run.task_id and rec["round"] == rnd and rec["rule_kind"] == kind
                  and rec["rule_param"] == param and len(rec["fragments"]) == len(run.layouts))
        raw_reports = run.store.get("meta", meta_key(run.task_id, b"r", rnd))
        stored_reports = json.loads(raw_reports) if raw_reports else None
        for i, fr in enumerate(rec["fragments"]):
            agg = check_fragment_outcome(run, rnd, i, fr, stored_reports)
            weights[i], momentum[i] = outer_step(weights[i], momentum[i], agg, lr, mu)
        for lay, w in zip(run.layouts, weights):
            scatter(run.model, lay, w)
        if snapshot_rounds == rnd + 1:
            run.check(f"node.md 'Model state': stored snapshot after {rnd + 1} rounds = recomputed weights and momentum",
                      stored_weights_match(run, weights, momentum, b"w"))
        mh = model_hash(run.model)
        run.check(f"r{rnd}: lifecycle.md 'Outer step' -> global model hash", hx(mh) == rec["model_hash"],
                  f"{hx(mh)} vs {rec['model_hash']}")
        run.leaves.append(round_record_leaf(rec))
        if run.receipt is not None:
            run.check(f"r{rnd}: lifecycle.md 'TrainingReceipt': transcript record = run-state record",
                      run.receipt["transcript"][rnd] == rec)
        run.final_hash = mh
    run.check("node.md 'What is stored where': stored final weights 'f' = recomputed, bit for bit",
              stored_weights_match(run, weights, None, b"f"))


def check_final_model_file(run: Run) -> None:
    """node.md "What is stored where": tensors hash to final_model_hash; the file is rebuildable."""
    if run.data_dir is None:
        run.note("final model file", "no --data-dir")
        return
    path = run.data_dir / "models" / f"{run.task_id}.safetensors"
    if not run.check("node.md 'What is stored where': final model file exists", path.exists(), str(path)):
        return
    data = path.read_bytes()
    meta, tensors = read_safetensors(data)
    run.check("node.md 'What is stored where': final model file tensors hash to final_model_hash",
              model_hash(fp32_state(tensors)) == run.final_hash)
    want_meta = {"format": "pt", "tenzro.task_id": run.task_id, "tenzro.model_hash": hx(run.final_hash),
                 "tenzro.run_root": hx(run.root)}
    run.check("node.md 'What is stored where': final model file metadata (format, task, model hash, run root)",
              meta == want_meta, str(meta))
    rebuilt = model_file_bytes(run.model, want_meta)
    run.check("node.md 'What is stored where': final model file rebuilt byte for byte from the doc",
              rebuilt == data, f"len {len(rebuilt)} vs {len(data)}; header {data[8:128]!r}")


def check_run_root(run: Run) -> None:
    run.check("lifecycle.md 'TrainingReceipt': final_model_hash = the last round's model hash",
              hx(run.final_hash) == (run.receipt or {}).get("final_model_hash"))
    run.leaves.append(final_record_leaf(run.task_id, len(run.state["records"]), run.final_hash))
    run.root = run_root(run.leaves)
    run.check("records.md 'Run leaves' + merkle.md 'Run root': run root", hx(run.root) == run.state["run_root"],
              f"{hx(run.root)} vs {run.state['run_root']}")
    tree = mth(run.leaves)
    ok = all(verify_inclusion(leaf, m, len(run.leaves), audit_path(run.leaves, m), tree) for m, leaf in enumerate(run.leaves))
    run.check("merkle.md 'Audit paths': every leaf's audit path verifies", ok)
    if run.run_view is not None:
        run.check("lifecycle.md 'Stored form and view': getRun run_root and round_records",
                  run.run_view["run_root"] == hx(run.root) and run.run_view["round_records"] == run.state["records"])


def receipt_syncers(records: list[dict[str, Any]]) -> list[str]:
    syncers: list[str] = []
    for rec in records:
        if rec["syncer"] not in syncers:
            syncers.append(rec["syncer"])
    return syncers


def receipt_abi(run: Run, syncers: list[str]) -> bytes:
    """receipt.md "ABI (version 1)": trainers by address, weight 0 when slashed."""
    rc = run.receipt or {}
    trainers = sorted(rc["trainers"], key=lambda t: unhex(t["address"]))
    rows = [(to_checksum_address(t["address"]), 0 if t["slashed"] else t["accepted_submissions"], int(t["stake"]),
             t["did"], bool(t["slashed"])) for t in trainers]
    return abi_encode([RECEIPT_TYPE], [(rc.get("version", 1), run.task_id, run.spec_canonical,
                                        to_checksum_address(run.spec["sponsor_address"]), int(run.spec["reward_pool"]),
                                        run.root, run.final_hash, run.leaves[1:-1], rows,
                                        [to_checksum_address(s) for s in syncers], rc["sealed_at"])])


def receipt_size(run: Run, syncers: list[str]) -> int:
    """receipt.md "Receipt size"."""
    rc = run.receipt or {}
    return (544 + word_pad(len(run.task_id)) + word_pad(len(run.spec_canonical))
            + sum(64 + len(leaf) for leaf in run.leaves[1:-1])
            + sum(224 + word_pad(len(t["did"].encode())) for t in rc["trainers"]) + 32 * len(syncers))


def round_record_size(run: Run, rec: dict[str, Any]) -> int:
    return 384 + word_pad(len(run.task_id)) + 224 * len(rec["fragments"]) + 32 * sum(len(f["accepted"]) for f in rec["fragments"])


def check_receipt(run: Run) -> None:
    rc = run.receipt
    if not run.check("node.md 'What is stored where': stored receipt present", rc is not None):
        return
    assert rc is not None
    records = run.state["records"]
    syncers = receipt_syncers(records)
    run.check("lifecycle.md 'TrainingReceipt': run_root and spec", rc["run_root"] == hx(run.root) and rc["spec"] == run.spec)
    run.check("lifecycle.md 'TrainingReceipt': syncers in order of first appearance", rc["syncers"] == syncers)
    run.check("receipt.md 'ABI': accepted_submissions = appearances in the accepted lists",
              all(t["accepted_submissions"] == run.accepted_counts.get(unhex(t["address"]), 0) for t in rc["trainers"]))
    run.abi = receipt_abi(run, syncers)
    if run.receipt_doc is not None:
        run.check("receipt.md 'ABI (version 1)': getReceipt abi = clean-room ReceiptV1 encoding",
                  run.receipt_doc["abi"] == hx(run.abi), f"len {len(run.abi)} vs {(len(run.receipt_doc['abi']) - 2) // 2}")
        run.check("rpc.md: getReceipt receipt = stored receipt JSON", run.receipt_doc["receipt"] == rc)
    else:
        run.note("receipt ABI", "no getReceipt answer to compare with (the sealed record below still covers it)")
    run.check("receipt.md 'Receipt size': round record and receipt size formulas",
              all(len(leaf) == round_record_size(run, rec) for leaf, rec in zip(run.leaves[1:-1], records))
              and receipt_size(run, syncers) == len(run.abi), f"{receipt_size(run, syncers)} vs {len(run.abi)}")
    sealed = run.store.get("meta", meta_key(run.task_id, b"v"))
    version = run.store.get("meta", b"schema_version")
    if sealed is None and version is not None and int.from_bytes(version, "big") < 3:
        # storage.md 'Schema version': stores before version 3 have none until a node opens them.
        run.note("sealed record", f"absent, as in every store of schema version {int.from_bytes(version, 'big')}")
    else:
        run.check("storage.md 'Column families': sealed record = run_root || SHA-256(receipt ABI)",
                  sealed == run.root + sha256(run.abi), sealed.hex() if sealed else "absent")
    run.check("ledger.md 'Payouts' / lifecycle.md 'Money': escrow and bonds closed after sealing",
              run.store.get("ledger", b"e" + lp(run.task_id)) is None
              and next(run.store.items("ledger", b"b" + lp(run.task_id)), None) is None)


@dataclass
class Settlement:
    """One sealed run's money, for the ledger check (ledger.md "Payouts", lifecycle.md "Money")."""

    sponsor: bytes
    pool: int
    payouts: dict[bytes, int]
    remainder: int
    stakes: list[tuple[bytes, int, bool]]


def settlement(run: Run) -> Settlement | None:
    if run.receipt is None:
        return None
    weights = {unhex(t["address"]): (0 if t["slashed"] else t["accepted_submissions"]) for t in run.receipt["trainers"]}
    pool = int(run.spec["reward_pool"])
    payouts, remainder = compute_payouts(pool, weights)
    stakes = [(unhex(t["address"]), int(t["stake"]), bool(t["slashed"])) for t in run.receipt["trainers"]]
    return Settlement(unhex(run.spec["sponsor_address"]), pool, payouts, remainder, stakes)


def verify_run(task_id: str, store: Store, res: Results, *, run_view: dict[str, Any] | None,
               receipt_doc: dict[str, Any] | None, data_dir: Path | None, ckpt_dir: str | None) -> Settlement | None:
    print(f"== {task_id}", flush=True)
    raw_state = store.get("training_runs", task_id.encode())
    if raw_state is None:
        res.check(task_id, "storage.md: run state present", False)
        return None
    raw_receipt = store.get("training_receipts", task_id.encode())
    stored = json.loads(raw_state)
    state = dict(stored)
    record_values: list[bytes] = []
    if "record_count" in state:  # storage.md 'Schema version' 4: each round record under its own key
        prefix = meta_key(task_id, b"c")
        found = [(k, v) for k, v in store.items("meta", prefix) if len(k) == len(prefix) + 4]
        res.check(task_id, "storage.md 'Column families and key formats': round_record_key holds rounds 0..record_count-1",
                  [k for k, _ in found] == [meta_key(task_id, b"c", r) for r in range(state["record_count"])],
                  f"{len(found)} key(s) for record_count {state['record_count']}")
        record_values = [v for _, v in found]
        state["records"] = [json.loads(v) for v in record_values]
        del state["record_count"]
    run = Run(task_id, store, res, raw_state, state, json.loads(raw_receipt) if raw_receipt else None,
              run_view, receipt_doc, data_dir)
    check_stored_form(run, stored, record_values)
    check_spec_and_seed(run)
    check_initial_model(run, ckpt_dir)
    check_run_view_layouts(run)
    check_rounds(run)
    check_run_root(run)
    check_final_model_file(run)
    check_receipt(run)
    return settlement(run)


def verify_ledger(store: Store, res: Results, settlements: list[Settlement]) -> None:
    """ledger.md "Payouts", "Slashing sink": balances = genesis - pools + remainders + payouts - slashed
    stakes, and minted || burned (assumes the verified runs are the only ones that moved money)."""
    print("== ledger", flush=True)
    genesis = json.loads(store.get("meta", b"node.genesis") or b"{}").get("genesis", [])
    balances: dict[bytes, int] = {}
    for g in genesis:
        balances[unhex(g["address"])] = balances.get(unhex(g["address"]), 0) + int(g["balance"])
    minted, burned = sum(balances.values()), 0
    for s in settlements:
        balances[s.sponsor] = balances.get(s.sponsor, 0) - s.pool + s.remainder
        for addr, amount in s.payouts.items():
            balances[addr] = balances.get(addr, 0) + amount
        for addr, stake, slashed in s.stakes:
            if slashed:
                balances[addr] -= stake
                burned += stake
    stored = {k: int.from_bytes(v, "big") for k, v in store.items("accounts")}
    mine = {k: v for k, v in balances.items() if v != 0}
    diff = {hx(k): (mine.get(k), stored.get(k)) for k in set(mine) | set(stored) if mine.get(k) != stored.get(k)}
    res.check("ledger", "ledger.md: account balances = genesis - pools + remainders + payouts - slashed stakes",
              not diff, str(diff))
    supply = store.get("ledger", b"s")
    res.check("ledger", "ledger.md 'Persistence': minted || burned", supply == minted.to_bytes(32, "big") + burned.to_bytes(32, "big"),
              supply.hex() if supply else "absent")


# --- main -----------------------------------------------------------------------------------------------


def rpc_call(url: str, method: str, params: Any) -> Any:
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}).encode()
    req = urllib.request.Request(url, body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        answer = json.loads(r.read())
    if "error" in answer:
        raise RuntimeError(answer["error"])
    return answer["result"]


def node_answers(args: argparse.Namespace, task_id: str) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """getRun and getReceipt answers (rpc.md), from a live node or saved files."""
    if args.rpc:
        return (rpc_call(args.rpc, "tenzro_training_getRun", {"task_id": task_id}),
                rpc_call(args.rpc, "tenzro_training_getReceipt", {"task_id": task_id}))
    if args.json_dir:
        d = Path(args.json_dir)
        run_file, receipt_file = d / f"{task_id}.run.json", d / f"{task_id}.receipt.json"
        return (json.loads(run_file.read_text()) if run_file.exists() else None,
                json.loads(receipt_file.read_text()) if receipt_file.exists() else None)
    return None, None


def sealed_task_ids(store: Store) -> list[str]:
    return [k.decode() for k, v in store.items("training_runs") if json.loads(v)["status"] == "Sealed"]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--db", required=True, help="the node's RocksDB directory (data_dir/db), opened read-only")
    ap.add_argument("--data-dir", help="the node's data dir (final model files under models/)")
    ap.add_argument("--rpc", help="a live node's JSON-RPC URL (getRun, getReceipt)")
    ap.add_argument("--json-dir", help="saved getRun/getReceipt answers: <task>.run.json, <task>.receipt.json")
    ap.add_argument("--task-id", action="append", help="verify only these runs (default: every sealed run; "
                    "the ledger is checked only then)")
    ap.add_argument("--ckpt-dir", help="where to look for an init checkpoint whose file:// path no longer exists")
    ap.add_argument("--require-no-project", action="store_true",
                    help="refuse to run (exit 2) when any project package is importable here")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    findable = project_packages_findable()
    if args.require_no_project and findable:
        print(f"refusing to run: the project is importable here ({', '.join(findable)})", file=sys.stderr)
        return 2
    sys.meta_path.insert(0, ProjectImportBlocker())
    if MUTATE and MUTATE not in MUTATIONS:
        print(f"unknown VERIFY_MUTATE={MUTATE!r}; known: {', '.join(MUTATIONS)}", file=sys.stderr)
        return 2
    if MUTATE:
        print(f"MUTATION {MUTATE} active: {MUTATIONS[MUTATE]} (checks should fail)", flush=True)
    store = Store(args.db)
    res = Results()
    tasks = args.task_id or sealed_task_ids(store)
    settlements = []
    for task_id in tasks:
        run_view, receipt_doc = node_answers(args, task_id)
        try:
            s = verify_run(task_id, store, res, run_view=run_view, receipt_doc=receipt_doc,
                           data_dir=Path(args.data_dir) if args.data_dir else None, ckpt_dir=args.ckpt_dir)
            if s is not None:
                settlements.append(s)
        except Exception as exc:  # a crash is a failed check of that run, not the end of the others
            import traceback

            traceback.print_exc()
            res.check(task_id, "verifier ran to the end", False, repr(exc))
    if not args.task_id:
        verify_ledger(store, res, settlements)
    store.close()
    return summarize(res, tasks)


def summarize(res: Results, tasks: list[str]) -> int:
    checks = [r for r in res.rows if r.ok is not None]
    failed = [r for r in checks if not r.ok]
    print()
    runs_passed = 0
    for t in tasks:
        own = res.of(t)
        ok = bool(own) and all(r.ok for r in own)
        runs_passed += ok
        print(f"RUN {t} {'OK' if ok else 'FAILED'} ({len(own)} checks)")
    for r in failed:
        print(f"FAIL {r.task}: {r.what}  {r.detail[:300]}")
    notes = sum(1 for r in res.rows if r.ok is None)
    print(f"SUMMARY runs={len(tasks)} runs_passed={runs_passed} checks={len(checks)} "
          f"passed={len(checks) - len(failed)} failed={len(failed)} notes={notes}", flush=True)
    return 1 if failed or not tasks else 0


if __name__ == "__main__":
    sys.exit(main())
