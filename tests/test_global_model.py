"""The round update as a third party computes it: the same payloads and weights give the same
aggregates, outcomes and model hash, whatever the order the caller built them in."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from tenzro_training.fragments import compute_model_hash
from tenzro_training.global_model import (
    compute_initial_model,
    compute_model_file_bytes,
    compute_round_update,
    compute_state_model_hash,
)
from tenzro_training.outer import OuterConfig, apply_outer_step, compute_initial_momentum
from tenzro_training.payload import PayloadHeader, encode_payload
from tenzro_training.aggregation import aggregate
from tenzro_training.spec import TrainingTaskSpec
from pathlib import Path
import json

SPEC = json.loads((Path(__file__).parent.parent / "tenzro_training/data/timesfm-200m-task.json").read_text())


def _spec(rule: object) -> TrainingTaskSpec:
    d = dict(SPEC, trainer_count=3, quorum=3, aggregation=rule, max_rounds=2)
    d["architecture"] = dict(SPEC["architecture"], fragment_count=2)
    return TrainingTaskSpec.from_dict(d)


def _state() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    return {"a.weight": torch.randn(5, 3, generator=g), "b.bias": torch.randn(4, generator=g)}


def _inputs(spec: TrainingTaskSpec, model, round_: int) -> list[list[tuple[bytes, bytes]]]:
    g = torch.Generator().manual_seed(11)
    out = []
    for lay in model.layouts:
        subs = []
        for t in range(3):
            flat = torch.randn(lay.numel, generator=g)
            header = PayloadHeader(spec.task_id, round_, lay.index, "raw", lay.layout_hash())
            subs.append((bytes([t + 1]) * 20, encode_payload(header, lay, flat)))
        out.append(subs)
    return out


def test_round_update_matches_a_direct_recomputation() -> None:
    spec = _spec("CoordinateMedian")
    initial = compute_initial_model(_state(), 2)
    assert initial.model_hash == compute_model_hash(_state())
    inputs = _inputs(spec, initial.model, 0)
    momentum = [compute_initial_momentum(lay.numel) for lay in initial.model.layouts]
    update = compute_round_update(spec, initial.model, 0, inputs, initial.weights, momentum, max_payload_bytes=1 << 20)
    # Reference: decode by hand, aggregate, step.
    from tenzro_training.payload import decode_payload

    expected = []
    for lay, subs, w, m in zip(initial.model.layouts, inputs, initial.weights, momentum):
        grads = [decode_payload(d, lay, max_bytes=1 << 20).flat_fp32() for _, d in subs]
        agg = aggregate(spec.aggregation, grads).tensor
        expected.append(apply_outer_step(w, m, agg, OuterConfig.from_spec(spec))[0])
    for got, want in zip(update.weights, expected):
        assert torch.equal(got, want)
    assert update.model_hash == compute_state_model_hash(initial.model, expected)
    assert update.model_hash != initial.model_hash
    assert [o.accepted for o in update.outcomes] == [tuple(t for t, _ in subs) for subs in inputs]


@pytest.mark.parametrize("rule", [{"Krum": {"f": 0}}, {"TrimmedMean": {"alpha_bps": 3400}}])
def test_round_update_is_reproducible_bit_for_bit_on_any_worker(rule: object) -> None:
    """Twice inline, and once on the one-thread executor the node hashes on: the same bits."""
    spec = _spec(rule)
    initial = compute_initial_model(_state(), 2)
    inputs = _inputs(spec, initial.model, 0)
    momentum = [compute_initial_momentum(lay.numel) for lay in initial.model.layouts]

    def update(**kw: object):  # type: ignore[no-untyped-def]
        return compute_round_update(spec, initial.model, 0, inputs, initial.weights, momentum,
                                    max_payload_bytes=1 << 20, **kw)

    a, b = update(), update()
    with ThreadPoolExecutor(max_workers=1) as pool:
        c = update(worker=pool)
    # In place (as the node runs it, on buffers it owns): the same bits, written into the inputs.
    own_w, own_m = [w.clone() for w in initial.weights], [m.clone() for m in momentum]
    d = compute_round_update(spec, initial.model, 0, inputs, own_w, own_m, max_payload_bytes=1 << 20, in_place=True)
    assert all(x is y for x, y in zip(d.weights, own_w)) and all(x is y for x, y in zip(d.momentum, own_m))
    assert all(torch.equal(m, torch.zeros_like(m)) for m in momentum)  # the default left the inputs alone
    for other in (b, c, d):
        assert other.model_hash == a.model_hash
        assert other.outcomes == a.outcomes
        assert [w.numpy().tobytes() for w in other.weights] == [w.numpy().tobytes() for w in a.weights]
        assert [m.numpy().tobytes() for m in other.momentum] == [m.numpy().tobytes() for m in a.momentum]


@pytest.mark.parametrize("rule", ["Mean", {"Krum": {"f": 0}}, {"TrimmedMean": {"alpha_bps": 3400}}])
def test_reused_round_buffers_change_no_bit_and_leak_into_no_update(rule: object) -> None:
    """RoundBuffers carry garbage from one round to the next: the next round's bits must not
    depend on it, and an update already returned must not change when the buffers are reused."""
    from tenzro_training.global_model import RoundBuffers

    spec = _spec(rule)
    initial = compute_initial_model(_state(), 2)
    momentum = [compute_initial_momentum(lay.numel) for lay in initial.model.layouts]
    fresh = compute_round_update(spec, initial.model, 0, _inputs(spec, initial.model, 0), initial.weights, momentum,
                                 max_payload_bytes=1 << 20)
    snapshot = [w.clone() for w in fresh.weights], [m.clone() for m in fresh.momentum]
    sizes = [lay.numel for lay in initial.model.layouts]
    buffers = RoundBuffers()
    buffers.take([sum(sizes) + max(sizes)])[0].fill_(float("nan"))  # garbage where the aggregates go
    held = buffers.nbytes
    own = [w.clone() for w in initial.weights], [m.clone() for m in momentum]
    first = compute_round_update(spec, initial.model, 0, _inputs(spec, initial.model, 0), *own,
                                 max_payload_bytes=1 << 20, in_place=True, buffers=buffers)
    assert buffers.nbytes == held  # exactly what a round of this model needs: not regrown
    # Round 1 on the same buffers, out of place: round 0's returned update must not move.
    second = compute_round_update(spec, initial.model, 1, _inputs(spec, initial.model, 1), first.weights,
                                  first.momentum, max_payload_bytes=1 << 20, buffers=buffers)
    assert buffers.nbytes == held  # big enough already: reused, not regrown
    for update in (first, fresh):
        assert update.model_hash == fresh.model_hash and update.outcomes == fresh.outcomes
        assert all(torch.equal(a, b) for a, b in zip(update.weights, snapshot[0]))
        assert all(torch.equal(a, b) for a, b in zip(update.momentum, snapshot[1]))
    unbuffered = compute_round_update(spec, initial.model, 1, _inputs(spec, initial.model, 1), fresh.weights,
                                      fresh.momentum, max_payload_bytes=1 << 20)
    assert second.model_hash == unbuffered.model_hash and second.outcomes == unbuffered.outcomes
    assert [w.numpy().tobytes() for w in second.weights] == [w.numpy().tobytes() for w in unbuffered.weights]


def test_round_buffers_hand_out_disjoint_vectors_and_grow_on_demand() -> None:
    from tenzro_training.global_model import RoundBuffers

    buffers = RoundBuffers()
    assert buffers.nbytes == 0
    a, b, c = buffers.take([3, 0, 5])
    assert (a.numel(), b.numel(), c.numel()) == (3, 0, 5) and buffers.nbytes == 32
    a.fill_(1.0)
    c.fill_(2.0)
    assert a.tolist() == [1.0] * 3 and c.tolist() == [2.0] * 5  # no overlap
    (small,) = buffers.take([4])
    assert buffers.nbytes == 32 and small.data_ptr() == a.data_ptr()  # reused
    (big,) = buffers.take([20])
    assert buffers.nbytes == 80
    big.fill_(3.0)
    assert c.tolist() == [2.0] * 5  # vectors from before the growth keep their (old) memory


def test_invalid_non_finite_payload_is_still_refused_by_the_round_update() -> None:
    """The round update skips the decoder's NaN scan; aggregation must still refuse the input."""
    from tenzro_training.aggregation import NonFiniteInputError

    spec = _spec("Mean")
    initial = compute_initial_model(_state(), 2)
    inputs = _inputs(spec, initial.model, 0)
    lay = initial.model.layouts[0]
    bad = torch.zeros(lay.numel)
    bad[1] = float("nan")
    # Built by hand: encode_payload itself refuses NaN, as a trainer's honest encoder would.
    import struct, json as _json

    good = inputs[0][0][1]
    n = struct.unpack("<Q", good[:8])[0]
    header = _json.loads(good[8 : 8 + n])
    body = bytearray(good[8 + n :])
    first = min(v["data_offsets"][0] for k, v in header.items() if k != "__metadata__")
    body[first + 4 : first + 8] = struct.pack("<f", float("nan"))
    inputs[0][0] = (inputs[0][0][0], good[: 8 + n] + bytes(body))
    momentum = [compute_initial_momentum(l.numel) for l in initial.model.layouts]
    with pytest.raises(NonFiniteInputError):
        compute_round_update(spec, initial.model, 0, inputs, initial.weights, momentum, max_payload_bytes=1 << 20)



def test_check_round_update_names_the_first_difference() -> None:
    """The verifier's rule: a recomputed round must equal its record, outcomes first."""
    import dataclasses

    from tenzro_training.global_model import RecordMismatch, check_round_update
    from tenzro_training.records import RoundRecord

    spec = _spec("Mean")
    initial = compute_initial_model(_state(), 2)
    momentum = [compute_initial_momentum(lay.numel) for lay in initial.model.layouts]
    update = compute_round_update(spec, initial.model, 0, _inputs(spec, initial.model, 0), initial.weights, momentum,
                                  max_payload_bytes=1 << 20)
    record = RoundRecord(task_id=spec.task_id, round=0, syncer=b"\x09" * 20, syncer_rank=1, rule_kind=0, rule_param=0,
                         fragments=update.outcomes, model_hash=update.model_hash)
    check_round_update(spec.task_id, record, update)  # equal: no error
    other_hash = dataclasses.replace(record, model_hash=b"\x00" * 32)
    with pytest.raises(RecordMismatch, match="round 0 of .* committed model hash") as info:
        check_round_update(spec.task_id, other_hash, update)
    assert info.value.what == "model hash"
    assert (info.value.task_id, info.value.round) == (spec.task_id, 0)
    first = dataclasses.replace(update.outcomes[0], aggregate_hash=b"\x00" * 32)
    other_outcome = dataclasses.replace(other_hash, fragments=(first, *update.outcomes[1:]))
    with pytest.raises(RecordMismatch) as info:
        check_round_update(spec.task_id, other_outcome, update)
    assert info.value.what == "fragment outcomes"


def test_final_model_file_is_the_layout_docs_node_md_pins() -> None:
    """docs/node.md "What is stored where" pins the file's bytes so a third party can rebuild
    it; this rebuilds it from that text alone (struct + json), not from the code's helper."""
    import struct

    from safetensors.torch import load as load_safetensors

    state = {
        "z_\u00e9t\u00e9": torch.tensor([1.5, -0.0], dtype=torch.float32),  # non-ASCII: \\u escapes
        "Emb": torch.arange(6, dtype=torch.float32).reshape(2, 3),  # sorts before "__metadata__"
        "empty": torch.zeros(0, 4),
        "scalar": torch.tensor(2.0),
    }
    init = compute_initial_model(state, 2)
    metadata = {"format": "pt", "tenzro.task_id": "t\u00e9", "tenzro.model_hash": "0x" + "ab" * 32,
                "tenzro.run_root": "0x" + "cd" * 32}
    data = compute_model_file_bytes(init.model, init.weights, metadata)

    header: dict[str, object] = {"__metadata__": metadata}
    chunks, offset = [], 0
    for name in sorted(state, key=lambda n: n.encode()):
        raw = struct.pack(f"<{state[name].numel()}f", *state[name].flatten().tolist())
        header[name] = {"data_offsets": [offset, offset + len(raw)], "dtype": "F32", "shape": list(state[name].shape)}
        chunks.append(raw)
        offset += len(raw)
    text = json.dumps(header, sort_keys=True, separators=(",", ":")).encode("ascii")
    text += b" " * (-len(text) % 8)
    assert data == struct.pack("<Q", len(text)) + text + b"".join(chunks)
    assert text.index(b'"Emb"') < text.index(b'"__metadata__"') < text.index(b'"empty"')
    loaded = load_safetensors(data)
    assert compute_model_hash(loaded) == init.model_hash


def test_a_run_stored_with_an_unparseable_encoding_value_replays_as_raw() -> None:
    """Before 2026-11-27 ``outer_gradient_encoding`` was free-form metadata, and such a run's node
    decoded raw payloads only: its rounds still recompute (upgrade review), exactly as without
    the key; a topk payload in it is refused."""
    from tenzro_training.payload import PayloadMetadataMismatch, encode_topk_payload

    d = dict(SPEC, trainer_count=3, quorum=3, aggregation="Mean", max_rounds=2)
    d["architecture"] = dict(SPEC["architecture"], fragment_count=2,
                             metadata={**SPEC["architecture"]["metadata"], "outer_gradient_encoding": "none"})
    old = TrainingTaskSpec.from_dict(d)
    plain = _spec("Mean")
    initial = compute_initial_model(_state(), 2)
    momentum = [compute_initial_momentum(lay.numel) for lay in initial.model.layouts]
    inputs = _inputs(plain, initial.model, 0)
    got = compute_round_update(old, initial.model, 0, inputs, initial.weights, momentum, max_payload_bytes=1 << 20)
    want = compute_round_update(plain, initial.model, 0, inputs, initial.weights, momentum, max_payload_bytes=1 << 20)
    assert got.model_hash == want.model_hash
    lay = initial.model.layouts[0]
    topk = encode_topk_payload(PayloadHeader(old.task_id, 0, 0, "topk", lay.layout_hash()), lay,
                               torch.tensor([0]), torch.tensor([1.0]))
    inputs[0][0] = (inputs[0][0][0], topk)
    with pytest.raises(PayloadMetadataMismatch, match="encoding"):
        compute_round_update(old, initial.model, 0, inputs, initial.weights, momentum, max_payload_bytes=1 << 20)


# --- layouts, hashes and inputs the verifier must refuse (mutation campaign 5, part C) ------------


def test_model_layout_from_specs_is_the_initial_models_whatever_the_spec_order() -> None:
    """The node rebuilds its layout from stored specs: any order gives the same name-ordered model."""
    from tenzro_training.global_model import ModelLayout

    initial = compute_initial_model(_state(), 2)
    rebuilt = ModelLayout.from_specs(list(initial.model.specs)[::-1], 2)
    assert rebuilt == initial.model
    assert compute_state_model_hash(rebuilt, initial.weights) == initial.model_hash


def test_only_zero_element_tensors_are_listed_apart_in_the_run_view() -> None:
    """A scalar or a one-element tensor lies in some fragment: only zero-element ones are listed apart."""
    state = {"empty": torch.zeros(0, 4), "one": torch.ones(1), "scalar": torch.tensor(2.0), "w": torch.ones(3)}
    model = compute_initial_model(state, 2).model
    assert model.to_empty_tensors_view() == [{"name": "empty", "shape": [0, 4]}]


def test_model_layout_from_views_refuses_a_listed_empty_tensor_that_is_not_one() -> None:
    """A trainer rebuilds the model from getRun's layouts and empty tensors: the same model and
    hash as the node's; an "empty" tensor with elements, or one some fragment slices, is refused."""
    from tenzro_training.errors import FragmentError
    from tenzro_training.fragments import TensorSpec
    from tenzro_training.global_model import ModelLayout

    state = {"b": torch.randn(3), "empty": torch.zeros(0, 4), "w": torch.randn(3, 2)}
    initial = compute_initial_model(state, 2)
    empty = TensorSpec("empty", (0, 4), "float32")
    rebuilt = ModelLayout.from_views(initial.model.layouts, [empty])
    assert rebuilt == initial.model
    assert compute_state_model_hash(rebuilt, initial.weights) == initial.model_hash
    with pytest.raises(FragmentError, match="'x' is listed as an empty tensor"):
        ModelLayout.from_views(initial.model.layouts, [empty, TensorSpec("x", (2,), "float32")])
    with pytest.raises(FragmentError, match="'w' is listed as an empty tensor"):
        ModelLayout.from_views(initial.model.layouts, [TensorSpec("w", (0,), "float32")])
    with pytest.raises(FragmentError, match="'empty' is listed as an empty tensor"):
        ModelLayout.from_views(initial.model.layouts, [empty, empty])


def test_full_state_and_model_hash_refuse_a_wrong_number_of_fragments() -> None:
    """A missing fragment is not zeros, an extra one is not ignored: both are refused."""
    from tenzro_training.global_model import compute_full_state

    initial = compute_initial_model(_state(), 2)
    extra = [*initial.weights, initial.weights[-1]]
    for fragments in (initial.weights[:-1], extra):
        with pytest.raises(ValueError, match=f"{len(fragments)} fragments for 2 layouts"):
            compute_full_state(initial.model, fragments)
        with pytest.raises(ValueError, match=f"{len(fragments)} fragments for 2 layouts"):
            compute_state_model_hash(initial.model, fragments)


def test_a_wrong_split_of_the_right_weights_does_not_hash_like_the_right_one() -> None:
    """The hash stream only counts elements: an element moved across a fragment boundary (same
    total) must be refused, naming the first fragment whose length is not its layout's."""
    from tenzro_training.errors import FragmentError

    initial = compute_initial_model(_state(), 2)
    w0, w1 = initial.weights
    short_first = [w0[:-1], torch.cat([w0[-1:], w1])]
    long_first = [torch.cat([w0, w1[:1]]), w1[1:]]
    for fragments in (short_first, long_first):
        with pytest.raises(FragmentError, match=f"fragment 0 has {fragments[0].numel()} elements, its layout "
                                                f"{w0.numel()}"):
            compute_state_model_hash(initial.model, fragments)
    with pytest.raises(FragmentError, match="fragment 0 has list elements"):
        compute_state_model_hash(initial.model, [w0.tolist(), w1])


def test_round_buffers_of_exactly_the_held_size_reuse_the_memory() -> None:
    """A node takes the same sizes every round: that must reuse the held memory, not regrow it."""
    from tenzro_training.global_model import RoundBuffers

    buffers = RoundBuffers()
    first, _ = buffers.take([3, 5])
    (again,) = buffers.take([8])
    assert buffers.nbytes == 32 and again.data_ptr() == first.data_ptr()


@pytest.mark.parametrize("short", ["inputs", "weights", "momentum", "all"])
def test_invalid_round_update_without_one_input_weight_and_momentum_per_fragment(short: str) -> None:
    spec = _spec("Mean")
    initial = compute_initial_model(_state(), 2)
    args = {"inputs": _inputs(spec, initial.model, 0), "weights": list(initial.weights),
            "momentum": [compute_initial_momentum(lay.numel) for lay in initial.model.layouts]}
    for name in args:
        if short in (name, "all"):
            args[name] = args[name][:-1]
    with pytest.raises(ValueError, match="one input list, weight and momentum vector per fragment expected"):
        compute_round_update(spec, initial.model, 0, args["inputs"], args["weights"], args["momentum"],
                             max_payload_bytes=1 << 20)


def test_invalid_round_update_of_a_payload_made_for_another_round_or_task() -> None:
    """A payload signed for round 1 (or another run) with the right layout is no input of round 0."""
    from tenzro_training.payload import PayloadMetadataMismatch

    spec = _spec("Mean")
    initial = compute_initial_model(_state(), 2)
    momentum = [compute_initial_momentum(lay.numel) for lay in initial.model.layouts]
    lay = initial.model.layouts[0]
    for header, field in ((PayloadHeader(spec.task_id, 1, 0, "raw", lay.layout_hash()), "round"),
                          (PayloadHeader("another-run", 0, 0, "raw", lay.layout_hash()), "task_id")):
        inputs = _inputs(spec, initial.model, 0)
        inputs[0][1] = (inputs[0][1][0], encode_payload(header, lay, torch.ones(lay.numel)))
        with pytest.raises(PayloadMetadataMismatch) as info:
            compute_round_update(spec, initial.model, 0, inputs, initial.weights, momentum, max_payload_bytes=1 << 20)
        assert info.value.field == field


def test_invalid_round_update_of_a_payload_one_byte_over_the_limit() -> None:
    from tenzro_training.payload import PayloadTooLarge

    spec = _spec("Mean")
    initial = compute_initial_model(_state(), 2)
    momentum = [compute_initial_momentum(lay.numel) for lay in initial.model.layouts]
    inputs = _inputs(spec, initial.model, 0)
    largest = max(len(data) for subs in inputs for _, data in subs)
    compute_round_update(spec, initial.model, 0, inputs, initial.weights, momentum, max_payload_bytes=largest)
    with pytest.raises(PayloadTooLarge) as info:
        compute_round_update(spec, initial.model, 0, inputs, initial.weights, momentum, max_payload_bytes=largest - 1)
    assert (info.value.size, info.value.limit) == (largest, largest - 1)


def test_each_fragment_outcome_summarizes_its_aggregation_report() -> None:
    """TrimmedMean's per-side trim and the report hash in the committed outcome are the report's."""
    spec = _spec({"TrimmedMean": {"alpha_bps": 3400}})
    initial = compute_initial_model(_state(), 2)
    momentum = [compute_initial_momentum(lay.numel) for lay in initial.model.layouts]
    update = compute_round_update(spec, initial.model, 0, _inputs(spec, initial.model, 0), initial.weights, momentum,
                                  max_payload_bytes=1 << 20)
    assert len(update.reports) == len(update.outcomes) == 2
    for outcome, report in zip(update.outcomes, update.reports):
        assert outcome.trimmed == report.trimmed_per_side == 1
        assert outcome.report_hash == report.report_hash() and outcome.selected == 0


def test_final_model_file_names_its_run_in_its_metadata() -> None:
    """evaluate-model and verify-run tell which run a model file is of from its __metadata__."""
    from tenzro_training.global_model import compute_final_model_file_bytes

    init = compute_initial_model(_state(), 2)
    data = compute_final_model_file_bytes("run-1", b"\xab" * 32, b"\xcd" * 32, init.model, init.weights)
    n = int.from_bytes(data[:8], "little")
    metadata = json.loads(data[8 : 8 + n])["__metadata__"]
    assert metadata == {"format": "pt", "tenzro.task_id": "run-1", "tenzro.model_hash": "0x" + "ab" * 32,
                        "tenzro.run_root": "0x" + "cd" * 32}
    assert data == compute_model_file_bytes(init.model, init.weights, metadata)
