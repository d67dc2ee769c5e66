"""The clean-room verifier's payload decoding (written from docs/payload.md "Encodings" and "topk"
alone, numpy only) gives the project's decoder's bits for topk payloads the project encodes, and
refuses what the doc refuses.

Unlike the verifier, this test imports the project: its encoder makes the payloads and its
decoder is the reference the verifier's bits are compared with. Every refusal is checked on both
decoders, so a case the doc refuses but the node accepts shows up here. The real runs (a sealed
topk run, the mutation controls) are in test_cleanroom_verifier.py.
"""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch

from tenzro_training.compression import PayloadEncoding, select_topk
from tenzro_training.errors import SpecError
from tenzro_training.fragments import FragmentLayout, compute_fragment_layouts
from tenzro_training.payload import (
    ENCODING_RAW,
    ENCODING_TOPK,
    PayloadError,
    PayloadHeader,
    decode_payload,
    encode_payload,
    encode_topk_payload,
)
from tests.conformance import cleanroom_verifier as cr

TASK, ROUND = "cr-topk-unit", 3
# Awkward names (one upper-case, sorting first by bytes), a scalar, a tensor split across fragments.
TENSORS = {"b.weight": (6, 5), "Emb": (4, 3), "scale": (), "z": (9,)}


def layouts() -> tuple[FragmentLayout, ...]:
    return compute_fragment_layouts({n: torch.zeros(s) for n, s in TENSORS.items()}, 2)


def cr_layout(lay: FragmentLayout) -> tuple[cr.Layout, bytes]:
    ours = cr.split_fragments([(n, s, "float32") for n, s in TENSORS.items()], 2)[lay.index]
    lh = cr.layout_hash(ours)
    assert lh == lay.layout_hash()
    return ours, lh


def vector(n: int, seed: int) -> torch.Tensor:
    g = torch.from_numpy((np.random.default_rng(seed).standard_normal(n) * 1e-2).astype(np.float32))
    g[0], g[1], g[2] = -0.0, 3.0, -3.0  # a signed zero and a magnitude tie (the lower index wins)
    return g


def topk_payload(lay: FragmentLayout, density_bps: int, dtype: str, seed: int = 1) -> tuple[bytes, int]:
    k = PayloadEncoding(ENCODING_TOPK, density_bps).kept(lay.numel)
    assert k is not None
    indices, values, _ = select_topk(vector(lay.numel, seed), k, dtype)
    header = PayloadHeader(TASK, ROUND, lay.index, ENCODING_TOPK, lay.layout_hash())
    return encode_topk_payload(header, lay, indices, values, dtype), k


def both(data: bytes, lay: FragmentLayout, topk_k: int | None = None, **options: int | None) -> tuple[np.ndarray, np.ndarray]:
    """(project's decoding, clean-room decoding) of one payload, fp32 bits; ``options``: the
    run's other decode option (``q8_block``), given to both."""
    ours, lh = cr_layout(lay)
    theirs = decode_payload(data, lay, max_bytes=1 << 20, max_abs=1e6, topk_k=topk_k, **options).flat_fp32().numpy()  # type: ignore[arg-type]
    mine = cr.decode_payload(data, ours, task_id=TASK, rnd=ROUND, lh=lh, topk_k=topk_k, **options)  # type: ignore[arg-type]
    return theirs.view(np.uint32), mine.view(np.uint32)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("density_bps", [1, 2500, 3333, 5000])
def test_topk_payloads_decode_to_the_projects_bits(dtype: str, density_bps: int) -> None:
    for lay in layouts():
        data, k = topk_payload(lay, density_bps, dtype, seed=lay.index)
        assert k == -(-lay.numel * density_bps // 10000) == cr.topk_kept(lay.numel, density_bps)
        theirs, mine = both(data, lay, k)
        assert np.array_equal(theirs, mine)
        assert np.count_nonzero(mine) <= k and mine.size == lay.numel


def test_raw_payloads_are_still_accepted_in_a_topk_run() -> None:
    for lay in layouts():
        header = PayloadHeader(TASK, ROUND, lay.index, ENCODING_RAW, lay.layout_hash())
        data = encode_payload(header, lay, vector(lay.numel, 5), "bfloat16")
        k = PayloadEncoding(ENCODING_TOPK, 2500).kept(lay.numel)
        theirs, mine = both(data, lay, k)
        assert np.array_equal(theirs, mine)
        assert np.array_equal(both(data, lay, None)[1], mine)


def test_the_metadata_value_selects_the_encoding() -> None:
    def spec(value: Any = None, *, present: bool = True) -> dict[str, Any]:
        md: dict[str, Any] = {"context_len": 16}
        if present:
            md["outer_gradient_encoding"] = value
        return {"architecture": {"metadata": md}}

    assert cr.payload_encoding(spec(present=False)) is None
    assert cr.payload_encoding(spec("raw")) is None
    assert cr.payload_encoding(spec({"topk": {"density_bps": 1}})) == ("topk", 1)
    assert cr.payload_encoding(spec({"topk": {"density_bps": 5000}})) == ("topk", 5000)
    assert cr.payload_encoding(spec({"q8": {"block_size": 16}})) == ("q8", 16)
    assert cr.payload_encoding(spec({"q8": {"block_size": 65536}})) == ("q8", 65536)
    for good in [{"topk": {"density_bps": 100, "feedback_decay": 0.5}}, {"q8": {"block_size": 256, "feedback_decay": 1}}]:
        # the trainers' decay: the same k or block size with or without it (spec.md "Metadata")
        name, inner = next(iter(good.items()))
        assert cr.payload_encoding(spec(good)) == (name, next(iter(inner.values())))
        assert PayloadEncoding.from_metadata(spec(good)["architecture"]["metadata"]).to_json() == good
    for bad in ["topk", None, {"topk": {"density_bps": 0}}, {"topk": {"density_bps": 5001}},
                {"topk": {"density_bps": True}}, {"topk": {"density_bps": 25.5}}, {"topk": {}},
                {"topk": {"density_bps": 100, "x": 1}}, {"topk": {"density_bps": 100}, "raw": {}},
                {"topk": {"density_bps": 100, "feedback_decay": 1.5}}, {"topk": {"block_size": 64}},
                "q8", {"q8": {}}, {"q8": {"block_size": 15}}, {"q8": {"block_size": 65537}},
                {"q8": {"block_size": 64.0}}, {"q8": {"block_size": True}}, {"q8": {"density_bps": 100}},
                {"q8": {"block_size": 64, "feedback_decay": -0.1}}, {"q8": {"block_size": 64, "x": 1}},
                {"q8": {"block_size": 64}, "topk": {"density_bps": 100}}]:
        with pytest.raises(ValueError):
            cr.payload_encoding(spec(bad))
        with pytest.raises(SpecError):
            PayloadEncoding.from_metadata(spec(bad)["architecture"]["metadata"])
        # ...and a stored run with it is read as raw only, by the project as by the verifier
        stored = SimpleNamespace(architecture=SimpleNamespace(metadata=spec(bad)["architecture"]["metadata"]))
        assert PayloadEncoding.of_run(stored) == PayloadEncoding()  # type: ignore[arg-type]


def split(data: bytes) -> tuple[dict[str, Any], bytes]:
    n = int.from_bytes(data[:8], "little")
    return json.loads(data[8:8 + n]), data[8 + n:]


def join(header: dict[str, Any], body: bytes) -> bytes:
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return len(text).to_bytes(8, "little") + text + body


def with_index(body: bytes, i: int, value: int) -> bytes:
    return body[:4 * i] + value.to_bytes(4, "little") + body[4 * i + 4:]


def refusals(lay: FragmentLayout, data: bytes, k: int) -> dict[str, tuple[bytes, int | None]]:
    """Payloads that docs/payload.md refuses, each with the topk_k it is decoded with."""
    header, body = split(data)
    idx = np.frombuffer(body[:4 * k], dtype="<u4")
    values = header["values"]
    nan = np.array([np.nan], dtype="<f4").tobytes()
    return {
        "topk payload in a raw-only run": (data, None),
        "k one more than the task's": (data, k + 1),
        "k one less than the task's": (data, k - 1),
        "indices not strictly ascending (a repeat)": (join(header, with_index(body, 1, int(idx[0]))), k),
        "indices descending (two swapped)": (join(header, with_index(with_index(body, 0, int(idx[1])), 1, int(idx[0]))), k),
        "last index = the fragment's element count": (join(header, with_index(body, k - 1, lay.numel)), k),
        "a NaN value": (join(header, body[:4 * k] + nan + body[4 * k + 4:]), k),
        "a trailing byte": (join(header, body + b"\x00"), k),
        "a byte missing": (join(header, body[:-1]), k),
        "a third tensor": (join({**header, "extra": {"dtype": "F32", "shape": [0], "data_offsets": [8 * k, 8 * k]}}, body), k),
        "values renamed": (join({**{n: t for n, t in header.items() if n != "values"}, "vals": values}, body), k),
        "indices as I32": (join({**header, "indices": {**header["indices"], "dtype": "I32"}}, body), k),
        "values in another dtype than declared": (join({**header, "values": {**values, "dtype": "F16"}}, body), k),
        "values before indices": (join({**header, "indices": {**header["indices"], "data_offsets": [4 * k, 8 * k]},
                                        "values": {**values, "data_offsets": [0, 4 * k]}}, body), k),
        "an extra key in a tensor": (join({**header, "values": {**values, "x": 1}}, body), k),
        "encoding unknown": (join({**header, "__metadata__": {**header["__metadata__"], "tenzro.encoding": "dct"}}, body), k),
    }


def assert_both_refuse(lay: FragmentLayout, cases: dict[str, tuple[bytes, int | None]], option: str) -> None:
    """Each case's payload, decoded with its value of the decode ``option`` (``topk_k``,
    ``q8_block``), is refused by the clean-room decoder and by the project's."""
    ours, lh = cr_layout(lay)
    for case, (bad, value) in cases.items():
        with pytest.raises(ValueError):
            cr.decode_payload(bad, ours, task_id=TASK, rnd=ROUND, lh=lh, **{option: value})
            pytest.fail(f"the clean-room decoder accepted: {case}")
        with pytest.raises(PayloadError):
            decode_payload(bad, lay, max_bytes=1 << 20, max_abs=1e6, **{option: value})  # type: ignore[arg-type]
            pytest.fail(f"the project's decoder accepted: {case}")


def test_the_cleanroom_decoder_refuses_what_the_doc_refuses() -> None:
    lay = layouts()[0]
    data, k = topk_payload(lay, 2500, "float32")
    assert k >= 3
    assert_both_refuse(lay, refusals(lay, data, k), "topk_k")


def test_the_mutations_change_the_decoded_vector(monkeypatch: pytest.MonkeyPatch) -> None:
    """The controls test_cleanroom_verifier.py runs on a real topk run differ here already."""
    lay = layouts()[1]
    ours, lh = cr_layout(lay)
    data, k = topk_payload(lay, 2500, "bfloat16")
    good = cr.decode_payload(data, ours, task_id=TASK, rnd=ROUND, lh=lh, topk_k=k)
    for mutation in ("topk_reversed", "topk_drop_one"):
        monkeypatch.setattr(cr, "MUTATE", mutation)
        bad = cr.decode_payload(data, ours, task_id=TASK, rnd=ROUND, lh=lh, topk_k=k)
        assert not np.array_equal(bad.view(np.uint32), good.view(np.uint32)), mutation
