"""A run whose spec selects the topk or q8 payload encoding (docs/payload.md "topk", "q8"),
through the node service on every store kind: it seals with the model the core computes from
the dense decoded gradients, accepts raw payloads too, and refuses compressed payloads a run
does not take."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from tenzro_training.aggregation import aggregate
from tenzro_training.compression import PayloadEncoding, dequantize_q8, quantize_q8, select_topk
from tenzro_training.errors import SpecError
from tenzro_training.fragments import compute_model_hash, gather_fragment, scatter_fragment
from tenzro_training.outer import OuterConfig, apply_outer_step
from tenzro_training.payload import (
    PayloadHeader,
    PayloadLayoutMismatch,
    PayloadMetadataMismatch,
    PayloadValueOutOfRange,
    encode_q8_payload,
    encode_topk_payload,
)
from tenzro_training.receipt import TrainingReceipt, verify_receipt
from tenzro_training.spec import TrainingTaskSpec
from tests.node.conftest import Net, gradient, initial_state, layouts_for, snapshot, spec_dict
from tests.node.test_service import canonical, start

TOPK = {"topk": {"density_bps": 2500}}


def topk_spec(checkpoint: tuple[str, str], encoding: object = TOPK, **overrides: Any) -> dict[str, Any]:
    doc = spec_dict(*checkpoint, **overrides)
    doc["architecture"]["metadata"]["outer_gradient_encoding"] = encoding
    return doc


def post_and_enroll(net: Net, spec: dict[str, Any]) -> None:
    net.post(spec)
    net.elect()
    for i in range(3):
        net.enroll(i)


def sparse(i: int, round_: int, fragment: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    lay = layouts_for()[fragment]
    idx, vals, _ = select_topk(gradient(i, round_, fragment, lay.numel), k, "float32")
    return idx, vals


def topk_payload(net: Net, i: int, round_: int, fragment: int, k: int) -> bytes:
    lay = net.layouts[fragment]
    header = PayloadHeader(net.task_id, round_, fragment, "topk", lay.layout_hash())
    return encode_topk_payload(header, lay, *sparse(i, round_, fragment, k))


def dense(i: int, round_: int, fragment: int, k: int | None) -> torch.Tensor:
    lay = layouts_for()[fragment]
    if k is None:
        return gradient(i, round_, fragment, lay.numel)
    out = torch.zeros(lay.numel)
    idx, vals = sparse(i, round_, fragment, k)
    out[idx] = vals
    return out


def assert_sealed_with(net: Net, spec: dict[str, Any],
                       decoded: Callable[[int, int, int], torch.Tensor]) -> TrainingReceipt:
    """The run sealed with the model the core computes from ``decoded(trainer, round, fragment)``,
    the dense vectors its 2 rounds x 2 fragments of payloads decode to; its receipt verifies and
    is returned."""
    task = TrainingTaskSpec.from_dict(spec)
    cfg = OuterConfig.from_spec(task)
    state = initial_state()
    weights = [gather_fragment(state, lay) for lay in net.layouts]
    momentum = [torch.zeros_like(w) for w in weights]
    for r in range(2):
        for f in range(2):
            grads = [decoded(i, r, f) for i in canonical((0, 1, 2))]
            agg = aggregate(task.aggregation, grads).tensor
            weights[f], momentum[f] = apply_outer_step(weights[f], momentum[f], agg, cfg)
    for lay, w in zip(net.layouts, weights):
        scatter_fragment(state, lay, w)
    receipt = TrainingReceipt.from_dict(net.service.get_receipt(net.task_id)["receipt"])
    assert verify_receipt(receipt)
    assert receipt.final_model_hash == compute_model_hash(state)
    return receipt


def test_a_topk_run_seals_with_the_model_of_the_dense_decoded_gradients(net: Net, checkpoint: tuple[str, str]) -> None:
    spec = topk_spec(checkpoint)
    post_and_enroll(net, spec)
    ks = PayloadEncoding.from_json(TOPK).kept_per_fragment(net.layouts)
    assert all(0 < k < lay.numel for k, lay in zip(ks, net.layouts))
    # trainers 0 and 1 send topk, trainer 2 raw (always accepted)
    kinds = {0: ks, 1: ks, 2: (None, None)}
    for r in range(2):
        for i in range(3):
            for f in range(2):
                payload = None if kinds[i][f] is None else topk_payload(net, i, r, f, kinds[i][f])
                net.submit(i, r, f, payload=payload)
        last = net.finalize(r)
    assert last["sealed"]

    receipt = assert_sealed_with(net, spec, lambda i, r, f: dense(i, r, f, kinds[i][f]))
    assert [t.accepted_submissions for t in receipt.trainers] == [4, 4, 4]
    # GET /metrics: what the encoding saved (trainer 2's raw payloads against the others' topk ones)
    topk_bytes = sum(len(topk_payload(net, i, r, f, ks[f])) for i in (0, 1) for r in (0, 1) for f in (0, 1))
    raw_bytes = sum(len(net.payload(2, r, f)) for r in (0, 1) for f in (0, 1))
    assert net.service.accepted_payload_stats() == {"topk": (8, topk_bytes), "raw": (4, raw_bytes)}


def test_a_raw_run_refuses_compressed_payloads_and_stores_nothing(net: Net, checkpoint: tuple[str, str]) -> None:
    start(net, checkpoint)
    before = snapshot(net.store)
    with pytest.raises(PayloadMetadataMismatch, match="encoding"):
        net.submit(0, 0, 0, payload=topk_payload(net, 0, 0, 0, 2))
    with pytest.raises(PayloadMetadataMismatch, match="'q8', expected 'raw'"):
        net.submit(0, 0, 0, payload=q8_payload(net, 0, 0, 0))
    assert snapshot(net.store) == before


def test_a_topk_run_refuses_another_k_and_out_of_range_values(net: Net, checkpoint: tuple[str, str]) -> None:
    post_and_enroll(net, topk_spec(checkpoint))
    k = PayloadEncoding.from_json(TOPK).kept(net.layouts[0].numel)
    before = snapshot(net.store)
    with pytest.raises(PayloadLayoutMismatch, match="values per payload"):
        net.submit(0, 0, 0, payload=topk_payload(net, 0, 0, 0, k + 1))
    lay = net.layouts[0]
    huge = encode_topk_payload(PayloadHeader(net.task_id, 0, 0, "topk", lay.layout_hash()), lay,
                               torch.arange(k), torch.full((k,), 1e7))
    with pytest.raises(PayloadValueOutOfRange):
        net.submit(0, 0, 0, payload=huge)
    assert snapshot(net.store) == before
    assert net.submit(0, 0, 0, payload=topk_payload(net, 0, 0, 0, k))["accepted_count"] == 1


def test_a_feedback_decay_changes_nothing_the_node_checks(net: Net, checkpoint: tuple[str, str]) -> None:
    """The decay is the trainers' (the node never sees a residual): the same k is taken."""
    post_and_enroll(net, topk_spec(checkpoint, {"topk": {"density_bps": 2500, "feedback_decay": 0.9}}))
    k = PayloadEncoding.from_json(TOPK).kept(net.layouts[0].numel)
    assert k is not None
    assert net.submit(0, 0, 0, payload=topk_payload(net, 0, 0, 0, k))["accepted_count"] == 1


@pytest.mark.parametrize("encoding", ["topk", {"topk": {"density_bps": 0}}, {"dct": {}},
                                      {"topk": {"density_bps": 100, "feedback_decay": 2}}, "q8", {"q8": {}},
                                      {"q8": {"block_size": 8}}, {"q8": {"block_size": 64, "density_bps": 100}}])
def test_post_task_refuses_a_bad_encoding_naming_the_field(
    net: Net, checkpoint: tuple[str, str], encoding: object
) -> None:
    before = snapshot(net.store)
    with pytest.raises(SpecError) as info:
        net.post(topk_spec(checkpoint, encoding))
    assert info.value.path.startswith("architecture.metadata.outer_gradient_encoding")
    assert snapshot(net.store) == before


def test_a_gossiped_topk_payload_is_held_and_named_by_a_hash_only_submission(net: Net, checkpoint: tuple[str, str]) -> None:
    """store_payload checks a topk run's gossiped payloads with the run's k, as a submission does."""
    from tenzro_training import auth
    from tenzro_training.payload import compute_payload_hash
    from tests.node.conftest import TRAINERS

    post_and_enroll(net, topk_spec(checkpoint))
    k = PayloadEncoding.from_json(TOPK).kept(net.layouts[1].numel)
    assert k is not None
    data = topk_payload(net, 1, 0, 1, k)
    digest = compute_payload_hash(data)
    sig = TRAINERS[1].sign(auth.SubmitOuterGradient(task_id=net.task_id, round=0, fragment=1, payload_hash=digest))
    assert net.service.store_payload(net.task_id, data, signer=(TRAINERS[1].address, 1, sig)) == digest
    assert net.submit(1, 0, 1, payload=data, hash_only=True)["accepted_count"] == 1
    other = topk_payload(net, 2, 0, 1, k)
    assert net.service.store_payload(net.task_id, other) == compute_payload_hash(other)  # unsigned: any fragment
    k0 = PayloadEncoding.from_json(TOPK).kept(net.layouts[0].numel)
    assert k0 is not None
    bad = topk_payload(net, 2, 0, 0, k0 + 1)
    bad_sig = TRAINERS[2].sign(auth.SubmitOuterGradient(task_id=net.task_id, round=0, fragment=0,
                                                        payload_hash=compute_payload_hash(bad)))
    before = snapshot(net.store)
    with pytest.raises(PayloadLayoutMismatch, match="values per payload"):
        net.service.store_payload(net.task_id, bad, signer=(TRAINERS[2].address, 0, bad_sig))
    assert snapshot(net.store) == before


def test_a_topk_post_whose_fragment_outgrows_u32_indices_is_refused(
    net: Net, checkpoint: tuple[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """topk payloads index a fragment's values with u32: a post whose checkpoint splits into a
    larger fragment is refused naming the encoding (the limit lowered to this tiny model's 9)."""
    import tenzro_training.compression as compression

    monkeypatch.setattr(compression, "MAX_TOPK_NUMEL", 8)  # fragment 0 holds 9 values
    before = snapshot(net.store)
    with pytest.raises(SpecError, match="topk indexes at most") as info:
        net.post(topk_spec(checkpoint))
    assert info.value.path == "architecture.metadata.outer_gradient_encoding"
    assert snapshot(net.store) == before
    assert net.post(spec_dict(*checkpoint))["status"] == "Electing"  # a raw run takes any fragment size


Q8 = {"q8": {"block_size": 16}}


def q8_payload(net: Net, i: int, round_: int, fragment: int, block: int = 16, dtype: str = "bfloat16") -> bytes:
    lay = net.layouts[fragment]
    scales, values, _ = quantize_q8(gradient(i, round_, fragment, lay.numel), block, dtype)
    header = PayloadHeader(net.task_id, round_, fragment, "q8", lay.layout_hash())
    return encode_q8_payload(header, lay, scales, values, block, dtype)


def q8_dense(i: int, round_: int, fragment: int) -> torch.Tensor:
    lay = layouts_for()[fragment]
    scales, values, _ = quantize_q8(gradient(i, round_, fragment, lay.numel), 16, "bfloat16")
    return dequantize_q8(scales, values, 16)


def test_a_q8_run_seals_with_the_model_of_the_dense_decoded_gradients(net: Net, checkpoint: tuple[str, str]) -> None:
    spec = topk_spec(checkpoint, Q8)
    post_and_enroll(net, spec)
    for r in range(2):
        for i in range(3):
            for f in range(2):  # trainers 0 and 1 send q8 (bf16 scales), trainer 2 raw (always accepted)
                net.submit(i, r, f, payload=q8_payload(net, i, r, f) if i < 2 else None)
        last = net.finalize(r)
    assert last["sealed"]

    assert not torch.equal(q8_dense(0, 0, 0), dense(0, 0, 0, None))  # the quantisation changed something
    receipt = assert_sealed_with(net, spec, lambda i, r, f: q8_dense(i, r, f) if i < 2 else dense(i, r, f, None))
    assert [t.accepted_submissions for t in receipt.trainers] == [4, 4, 4]
    q8_bytes = sum(len(q8_payload(net, i, r, f)) for i in (0, 1) for r in (0, 1) for f in (0, 1))
    raw_bytes = sum(len(net.payload(2, r, f)) for r in (0, 1) for f in (0, 1))
    assert net.service.accepted_payload_stats() == {"q8": (8, q8_bytes), "raw": (4, raw_bytes)}


def test_a_q8_run_refuses_other_blocks_topk_payloads_and_out_of_range_values(
    net: Net, checkpoint: tuple[str, str]
) -> None:
    post_and_enroll(net, topk_spec(checkpoint, Q8))
    before = snapshot(net.store)
    with pytest.raises(PayloadLayoutMismatch, match="blocks of 16"):
        net.submit(0, 0, 0, payload=q8_payload(net, 0, 0, 0, block=4))  # 3 scales where the run takes 1
    with pytest.raises(PayloadMetadataMismatch, match="encoding"):
        net.submit(0, 0, 0, payload=topk_payload(net, 0, 0, 0, 2))
    lay = net.layouts[0]
    huge = encode_q8_payload(PayloadHeader(net.task_id, 0, 0, "q8", lay.layout_hash()), lay,
                             torch.full((1,), 1e5), torch.full((lay.numel,), 127, dtype=torch.int8), 16)
    with pytest.raises(PayloadValueOutOfRange):  # 127 * 1e5 above max_gradient_abs
        net.submit(0, 0, 0, payload=huge)
    assert snapshot(net.store) == before
    assert net.submit(0, 0, 0, payload=q8_payload(net, 0, 0, 0))["accepted_count"] == 1


def test_a_topk_run_refuses_q8_payloads(net: Net, checkpoint: tuple[str, str]) -> None:
    post_and_enroll(net, topk_spec(checkpoint))
    before = snapshot(net.store)
    with pytest.raises(PayloadMetadataMismatch, match="expected 'raw, topk'"):
        net.submit(0, 0, 0, payload=q8_payload(net, 0, 0, 0))
    assert snapshot(net.store) == before
