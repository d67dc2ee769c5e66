"""Tests for tenzro_training.compression: the task's payload encoding (parsing, limits, k per
fragment) and the trainer's top-k selection with error feedback."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tenzro_training.compression import (
    DEFAULT_FEEDBACK_DECAY,
    MAX_DENSITY_BPS,
    CompressionError,
    ErrorFeedback,
    PayloadEncoding,
    select_topk,
)
from tenzro_training.errors import SpecError
from tenzro_training.fragments import compute_fragment_layouts
from tenzro_training.payload import PayloadHeader, decode_payload, encode_topk_payload

from tests.safetensors_files import relabel_dtype

LAYOUTS = compute_fragment_layouts({"w": torch.zeros(30, 7), "b": torch.zeros(11)}, 2)  # 221 values


# --- the encoding value ---------------------------------------------------------------------


def test_absent_and_raw_mean_raw() -> None:
    assert PayloadEncoding.from_metadata({}) == PayloadEncoding() == PayloadEncoding.from_json("raw")
    raw = PayloadEncoding()
    assert not raw.is_sparse and raw.kept(100) is None and raw.to_json() == "raw" and raw.describe() == "raw"


def test_topk_keeps_ceil_of_the_density() -> None:
    enc = PayloadEncoding.from_json({"topk": {"density_bps": 100}})
    assert enc.is_sparse and enc.to_json() == {"topk": {"density_bps": 100}} and enc.describe() == "topk 1%"
    assert [enc.kept(n) for n in (0, 1, 99, 100, 101, 1_000_000)] == [0, 1, 1, 1, 2, 10_000]
    assert PayloadEncoding("topk", MAX_DENSITY_BPS).kept(7) == 4
    assert enc.kept_per_fragment(LAYOUTS) == tuple(-(-lay.numel // 100) for lay in LAYOUTS)


@pytest.mark.parametrize(
    "value, path",
    [
        ("Raw", "outer_gradient_encoding"),
        ({"topk": {"density_bps": 0}}, "outer_gradient_encoding.topk.density_bps"),
        ({"topk": {"density_bps": 5001}}, "outer_gradient_encoding.topk.density_bps"),
        ({"topk": {"density_bps": 1.5}}, "outer_gradient_encoding.topk.density_bps"),
        ({"topk": {"density_bps": True}}, "outer_gradient_encoding.topk.density_bps"),
        ({"topk": {}}, "outer_gradient_encoding.topk"),
        ({"topk": {"feedback_decay": 0.9}}, "outer_gradient_encoding.topk"),
        ({"topk": {"density_bps": 10, "feedback_decay": -0.1}}, "outer_gradient_encoding.topk.feedback_decay"),
        ({"topk": {"density_bps": 10, "feedback_decay": 1.5}}, "outer_gradient_encoding.topk.feedback_decay"),
        ({"topk": {"density_bps": 10, "feedback_decay": "0.9"}}, "outer_gradient_encoding.topk.feedback_decay"),
        ({"topk": {"density_bps": 10, "feedback_decay": True}}, "outer_gradient_encoding.topk.feedback_decay"),
        ({"topk": {"density_bps": 10, "feedback_decay": None}}, "outer_gradient_encoding.topk.feedback_decay"),
        ({"topk": {"density_bps": 10, "bits": 2}}, "outer_gradient_encoding.topk"),
        ({"topk": 10}, "outer_gradient_encoding.topk"),
        ({"topk": {"density_bps": 10}, "raw": {}}, "outer_gradient_encoding"),
        ({"dct": {"density_bps": 10}}, "outer_gradient_encoding"),
        (None, "outer_gradient_encoding"),
    ],
)
def test_bad_values_are_spec_errors_naming_the_field(value: object, path: str) -> None:
    with pytest.raises(SpecError) as info:
        PayloadEncoding.from_metadata({"outer_gradient_encoding": value})
    assert info.value.path == f"architecture.metadata.{path}"


def test_an_error_quotes_at_most_60_characters_of_a_bad_value() -> None:
    """The value is the sponsor's, of any size: its repr is cut to 57 characters and "..."."""
    with pytest.raises(SpecError) as info:
        PayloadEncoding.from_json("x" * 1000)
    assert info.value.reason.endswith("got '" + "x" * 56 + "...")
    with pytest.raises(SpecError) as short:
        PayloadEncoding.from_json("x" * 58)  # a repr of exactly 60 characters is quoted whole
    assert short.value.reason.endswith("got '" + "x" * 58 + "'")
    with pytest.raises(SpecError, match=r"got 'x{56}\.\.\.$"):
        PayloadEncoding("topk", 100, "x" * 1000)  # type: ignore[arg-type]


def test_the_constructor_validates_too() -> None:
    for name, density in [("raw", 5), ("topk", None), ("dct", 5)]:
        with pytest.raises(SpecError):
            PayloadEncoding(name, density)
    with pytest.raises(SpecError):
        PayloadEncoding("raw", None, 0.5)
    with pytest.raises(SpecError, match="feedback_decay"):
        PayloadEncoding("topk", 100, float("nan"))


@pytest.mark.parametrize("decay", [0, 0.5, 0.95, 1])
def test_a_feedback_decay_is_the_trainers_alone(decay: float) -> None:
    """It round-trips through JSON, and changes nothing the node reads (k, the wire name)."""
    enc = PayloadEncoding.from_json({"topk": {"density_bps": 100, "feedback_decay": decay}})
    assert enc.feedback_decay == decay and enc.to_json() == {"topk": {"density_bps": 100, "feedback_decay": decay}}
    plain = PayloadEncoding("topk", 100)
    assert enc.describe() == plain.describe() == "topk 1%" and enc.kept(12345) == plain.kept(12345)
    assert enc.describe_feedback() == {0: "no error feedback (feedback_decay 0)", 1: "error feedback"}.get(
        decay, f"error feedback decayed by {decay:g} each round")
    assert enc.decay == decay and plain.feedback_decay is None and plain.decay == DEFAULT_FEEDBACK_DECAY == 0.95
    assert plain.describe_feedback() == "error feedback decayed by 0.95 each round"
    assert PayloadEncoding().decay == 1.0


def test_a_decayed_residual_is_multiplied_before_the_new_gradient_is_added() -> None:
    gen = torch.Generator().manual_seed(3)
    grads = [[torch.randn(lay.numel, generator=gen) for lay in LAYOUTS] for _ in range(2)]
    decayed = ErrorFeedback(LAYOUTS, PayloadEncoding("topk", 1000, 0.5))
    plain = ErrorFeedback(LAYOUTS, PayloadEncoding("topk", 1000, 1))
    decayed.compress(grads[0], "float32")
    plain.compress(grads[0], "float32")
    first = [r.clone() for r in decayed._residual]
    assert all(torch.equal(a, b) for a, b in zip(first, plain._residual))  # nothing to decay in round 0
    sent = decayed.compress(grads[1], "float32")
    for (idx, vals), g, r, lay in zip(sent, grads[1], first, LAYOUTS):
        want = select_topk(g + r * 0.5, idx.numel(), "float32")
        assert torch.equal(idx, want[0]) and torch.equal(vals, want[1])
    plain.compress(grads[1], "float32")
    assert not any(torch.equal(a, b) for a, b in zip(decayed._residual, plain._residual))
    # Decay 0: plain top-k, nothing carried.
    none = ErrorFeedback(LAYOUTS, PayloadEncoding("topk", 1000, 0))
    none.compress(grads[0], "float32")
    (idx, vals), _ = none.compress(grads[1], "float32")
    assert torch.equal(vals, select_topk(grads[1][0], idx.numel(), "float32")[1])


def test_the_default_decay_multiplies_the_residual_by_0_95() -> None:
    """No ``feedback_decay`` in the JSON: round 2 selects from g + 0.95 r, not g + r."""
    gen = torch.Generator().manual_seed(4)
    grads = [[torch.randn(lay.numel, generator=gen) for lay in LAYOUTS] for _ in range(2)]
    fb = ErrorFeedback(LAYOUTS, PayloadEncoding("topk", 1000))
    fb.compress(grads[0], "float32")
    first = [r.clone() for r in fb._residual]
    sent = fb.compress(grads[1], "float32")
    for (idx, vals), g, r, rest in zip(sent, grads[1], first, fb._residual):
        want = select_topk(g + r * 0.95, idx.numel(), "float32")
        assert torch.equal(idx, want[0]) and torch.equal(vals, want[1]) and torch.equal(rest, want[2])


def test_decay_0_sends_the_plain_top_k_of_the_gradient_bit_for_bit() -> None:
    """Nothing of the residual is added, not even as r * 0: -0.0 + 0.0 would turn a gradient's
    -0.0 into +0.0, and the payload's bits would differ from plain top-k's."""
    fb = ErrorFeedback(LAYOUTS, PayloadEncoding("topk", 1000, 0))
    fb.compress([torch.ones(lay.numel) for lay in LAYOUTS], "float32")  # leaves a positive residual
    zeros = [torch.full((lay.numel,), -0.0) for lay in LAYOUTS]
    sent = fb.compress(zeros, "float32")
    for (idx, vals), g, r in zip(sent, zeros, fb._residual):
        want = select_topk(g, idx.numel(), "float32")
        assert torch.equal(idx, want[0]) and torch.equal(vals.view(torch.int32), want[1].view(torch.int32))
        assert torch.equal(r.view(torch.int32), want[2].view(torch.int32))  # every -0.0 kept


# --- select_topk ----------------------------------------------------------------------------


def test_select_topk_takes_the_largest_magnitudes_in_index_order() -> None:
    x = torch.tensor([0.5, -3.0, 2.0, 0.0, -2.0, 3.0, 1.0])
    idx, vals, rest = select_topk(x, 3, "float32")
    assert idx.tolist() == [1, 2, 5]  # |-3| and |3|, then the tie 2.0 / -2.0 goes to the lower index
    assert vals.tolist() == [-3.0, 2.0, 3.0]
    assert rest.tolist() == [0.5, 0.0, 0.0, 0.0, -2.0, 0.0, 1.0]
    assert x.tolist() == [0.5, -3.0, 2.0, 0.0, -2.0, 3.0, 1.0]  # input untouched


@settings(max_examples=300, deadline=None)
@given(
    values=st.lists(st.sampled_from([0.0, -0.0, 1.0, -1.0, 2.0, -2.0, 0.5, 3.0]) | st.floats(-4, 4, width=32),
                    min_size=0, max_size=48),
    frac=st.floats(0, 1),
)
def test_the_choice_is_a_stable_sort_on_minus_the_magnitude(values, frac) -> None:
    """The selection equals the obvious definition (a stable sort, so ties to the lower index),
    on inputs full of ties, zeros of both signs included."""
    x = torch.tensor(values, dtype=torch.float32)
    k = int(frac * len(values))
    want = torch.sort(torch.sort(x.abs().neg(), stable=True).indices[:k]).values
    assert select_topk(x, k, "float32")[0].tolist() == want.tolist()


def test_non_finite_inputs_are_refused() -> None:
    for bad in (float("nan"), float("inf")):
        with pytest.raises(CompressionError, match="NaN or Inf"):
            select_topk(torch.tensor([1.0, bad]), 1, "float32")


def test_the_cast_error_stays_in_the_residual() -> None:
    x = torch.tensor([1.0 + 2**-12, 0.25])
    idx, vals, rest = select_topk(x, 1, "bfloat16")
    assert idx.tolist() == [0] and vals.dtype == torch.bfloat16 and vals.float().tolist() == [1.0]
    assert rest.tolist() == [2**-12, 0.25]


def test_select_topk_refuses_bad_inputs() -> None:
    with pytest.raises(CompressionError):
        select_topk(torch.zeros(3, 2), 1, "float32")
    with pytest.raises(CompressionError):
        select_topk(torch.zeros(3, dtype=torch.float64), 1, "float32")
    with pytest.raises(CompressionError):
        select_topk(torch.zeros(3), 4, "float32")
    with pytest.raises(CompressionError):
        select_topk(torch.zeros(3), 1, "int8")


@pytest.mark.parametrize("k", [True, False, 1.0, -1, "1"])
def test_select_topk_refuses_a_k_that_is_not_a_count(k: object) -> None:
    """A bool (True == 1), a float or a negative number is refused as the other bad inputs are,
    not passed on to torch.topk (which takes True as 1, and raises its own errors otherwise)."""
    with pytest.raises(CompressionError, match="k must be an integer in 0..3"):
        select_topk(torch.tensor([1.0, -2.0, 3.0]), k, "float32")  # type: ignore[arg-type]


@settings(max_examples=200, deadline=None)
@given(
    values=st.lists(st.floats(-6e4, 6e4, width=32), min_size=1, max_size=64),  # within float16's range
    frac=st.floats(0, 1),
    dtype=st.sampled_from(["float32", "float16", "bfloat16"]),
)
def test_sent_plus_residual_is_the_input_and_nothing_larger_is_left(values, frac, dtype) -> None:
    x = torch.tensor(values, dtype=torch.float32)
    k = int(frac * len(values))
    idx, vals, rest = select_topk(x, k, dtype)
    assert idx.numel() == k and (k < 2 or bool((idx[1:] > idx[:-1]).all()))
    if dtype == "float32":
        sent = torch.zeros_like(x)
        sent[idx] = vals
        assert torch.equal(sent + rest, x)  # exact: each position is in one of the two
    unsent = torch.ones(len(values), dtype=torch.bool)
    unsent[idx] = False
    if k and bool(unsent.any()):
        assert float(x[unsent].abs().max()) <= float(x[idx].abs().min())


# --- error feedback -------------------------------------------------------------------------


def _decode(lay, idx, vals, k):
    data = encode_topk_payload(PayloadHeader("t", 0, lay.index, "topk", lay.layout_hash()), lay, idx, vals)
    return decode_payload(data, lay, max_bytes=1 << 20, topk_k=k).flat_fp32()


def test_error_feedback_conserves_the_gradient_and_sends_every_coordinate_in_time() -> None:
    enc = PayloadEncoding("topk", 1000, 1)  # 10%, undecayed: nothing is lost, only delayed
    fb = ErrorFeedback(LAYOUTS, enc)
    gen = torch.Generator().manual_seed(3)
    total = [torch.zeros(lay.numel) for lay in LAYOUTS]
    sent = [torch.zeros(lay.numel) for lay in LAYOUTS]
    ever = [torch.zeros(lay.numel, dtype=torch.bool) for lay in LAYOUTS]
    for _ in range(40):
        grads = [torch.rand(lay.numel, generator=gen) + 0.5 for lay in LAYOUTS]  # every coordinate matters
        for i, ((idx, vals), lay, k) in enumerate(zip(fb.compress(grads, "float32"), LAYOUTS, enc.kept_per_fragment(LAYOUTS))):
            assert idx.numel() == k
            dense = _decode(lay, idx, vals, k)
            sent[i] += dense
            total[i] += grads[i]
            ever[i][idx] = True
    assert all(bool(e.all()) for e in ever)  # without feedback the same large coordinates would win every round
    # What was sent plus what is still held is what was trained (up to fp32 rounding).
    held = sum(float((t - s).sum()) for s, t in zip(sent, total))
    assert held == pytest.approx(sum(float(r.sum()) for r in fb._residual), rel=1e-4)
    assert fb.residual_norm() > 0


def test_the_residual_norm_is_summed_in_float64_and_does_not_overflow() -> None:
    """Each unsent 1e20 squares to 1e40, beyond float32's range: the norm is still finite."""
    import math

    fb = ErrorFeedback(LAYOUTS, PayloadEncoding("topk", 100))  # 2 of 111 and 2 of 110 values sent
    fb.compress([torch.full((lay.numel,), 1e20) for lay in LAYOUTS], "float32")
    assert fb.residual_norm() == pytest.approx(math.sqrt(109 + 108) * float(torch.tensor(1e20)), rel=1e-12)


def test_error_feedback_checks_every_input_before_changing_anything() -> None:
    fb = ErrorFeedback(LAYOUTS, PayloadEncoding("topk", 100))
    good = [torch.ones(lay.numel) for lay in LAYOUTS]
    fb.compress(good, "float32")
    before = fb.residual_norm()
    with pytest.raises(CompressionError):
        fb.compress([good[0], torch.ones(3)], "float32")
    with pytest.raises(CompressionError):
        fb.compress(good[:1], "float32")
    assert fb.residual_norm() == before
    with pytest.raises(CompressionError):
        ErrorFeedback(LAYOUTS, PayloadEncoding())


@pytest.mark.parametrize("bad", [torch.ones(110, 1), torch.ones(110, dtype=torch.float64), torch.ones(111)])
def test_compress_names_the_fragment_whose_outer_gradient_is_not_a_float32_vector(bad: torch.Tensor) -> None:
    """Checked against the layout before any selection: a [110, 1] column (which would broadcast
    against the residual to [110, 110]) or a float64 vector is refused naming its fragment, as
    a wrong length is, and nothing changes."""
    fb = ErrorFeedback(LAYOUTS, PayloadEncoding("topk", 1000))
    good = [torch.ones(lay.numel) for lay in LAYOUTS]
    fb.compress(good, "float32")
    before = [r.clone() for r in fb._residual]
    with pytest.raises(CompressionError, match="fragment 1 needs a 1-D float32 vector of 110 values"):
        fb.compress([good[0], bad], "float32")
    assert all(torch.equal(a, b) for a, b in zip(fb._residual, before))


def test_a_fragment_beyond_u32_indices_is_refused_for_topk_only() -> None:
    huge = compute_fragment_layouts({"w": torch.empty(2**32 + 1, device="meta")}, 1)
    fits = compute_fragment_layouts({"w": torch.empty(2**32, device="meta")}, 1)
    with pytest.raises(SpecError, match="at most 2"):
        PayloadEncoding("topk", 10).check_layouts(huge)
    PayloadEncoding("topk", 10).check_layouts(fits)
    PayloadEncoding().check_layouts(huge)


def test_describe_sparse_cost_names_the_rule_and_is_silent_for_mean_and_raw() -> None:
    from tenzro_training.compression import describe_sparse_cost
    from tenzro_training.rules import AggregationRule

    topk = PayloadEncoding("topk", 100)
    assert describe_sparse_cost(topk, AggregationRule.from_spec("Mean")) is None
    assert describe_sparse_cost(PayloadEncoding(), AggregationRule.from_spec("CoordinateMedian")) is None
    said = describe_sparse_cost(topk, AggregationRule.from_spec({"Krum": {"f": 1}}))
    assert said is not None and said.startswith("outer gradients travel as topk 1% of each fragment, and Krum")


def test_restore_unsent_puts_the_last_rounds_values_back_once() -> None:
    fb = ErrorFeedback(LAYOUTS, PayloadEncoding("topk", 1000, 1))
    gen = torch.Generator().manual_seed(5)
    first = [torch.randn(lay.numel, generator=gen) for lay in LAYOUTS]
    fb.compress(first, "float32")
    assert fb.restore_unsent([1]) == 1 and fb.restore_unsent([1]) == 0  # once
    # fragment 1 holds everything again (fp32: exactly the vector); fragment 0 what it did not send
    assert torch.equal(fb._residual[1], first[1])
    assert not torch.equal(fb._residual[0], first[0])
    assert fb.restore_unsent([0, 1]) == 1 and torch.equal(fb._residual[0], first[0])
    # the next round compresses the new gradient plus all of it
    second = [torch.randn(lay.numel, generator=gen) for lay in LAYOUTS]
    (idx, vals), _ = fb.compress(second, "float32")
    assert torch.equal(vals, select_topk(second[0] + first[0], idx.numel(), "float32")[1])
    assert ErrorFeedback(LAYOUTS, PayloadEncoding("topk", 1000)).restore_unsent([0, 1]) == 0  # nothing made yet


def test_restore_unsent_counts_every_fragment_it_restores() -> None:
    fb = ErrorFeedback(LAYOUTS, PayloadEncoding("topk", 1000, 1))
    gen = torch.Generator().manual_seed(6)
    grads = [torch.randn(lay.numel, generator=gen) for lay in LAYOUTS]
    fb.compress(grads, "float32")
    assert fb.restore_unsent([1, 0, 1]) == 2 and fb.restore_unsent([0, 1]) == 0
    assert all(torch.equal(r, g) for r, g in zip(fb._residual, grads))


def test_a_value_that_overflows_the_payload_dtype_leaves_the_residual_alone() -> None:
    fb = ErrorFeedback(LAYOUTS, PayloadEncoding("topk", 100))
    grads = [torch.zeros(lay.numel) for lay in LAYOUTS]
    grads[1][3] = 70000.0  # above float16's 65504
    with pytest.raises(CompressionError, match="overflows float16"):
        fb.compress(grads, "float16")
    assert fb.residual_norm() == 0.0
    assert 70000.0 in fb.compress(grads, "float32")[1][1].tolist()


def test_a_stored_run_reads_a_value_that_does_not_parse_as_raw() -> None:
    """Before 2026-11-27 the key was free-form metadata: such a run was decoded raw, and still is;
    only posting is strict."""
    from types import SimpleNamespace

    old = SimpleNamespace(architecture=SimpleNamespace(metadata={"outer_gradient_encoding": "none"}))
    assert PayloadEncoding.of_run(old) == PayloadEncoding()  # type: ignore[arg-type]
    with pytest.raises(SpecError):
        PayloadEncoding.from_spec(old)  # type: ignore[arg-type]
    new = SimpleNamespace(architecture=SimpleNamespace(metadata={"outer_gradient_encoding": {"topk": {"density_bps": 7}}}))
    assert PayloadEncoding.of_run(new) == PayloadEncoding("topk", 7)  # type: ignore[arg-type]


# --- the saved state (a restarted trainer) -------------------------------------------------


def _saved_state(dtype: str = "bfloat16") -> tuple[ErrorFeedback, bytes]:
    fb = ErrorFeedback(LAYOUTS, PayloadEncoding("topk", 1000))
    gen = torch.Generator().manual_seed(9)
    for _ in range(3):
        fb.compress([torch.randn(lay.numel, generator=gen) for lay in LAYOUTS], dtype)
    return fb, fb.to_bytes({"round": "2"})


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_a_saved_state_continues_bit_for_bit(dtype: str) -> None:
    """What the trainer that never stopped sends and keeps, the restarted one sends and keeps:
    the residual and the last round's sent values (for restore_unsent) come back exactly."""
    fb, data = _saved_state(dtype)
    again, metadata = ErrorFeedback.from_bytes(LAYOUTS, PayloadEncoding("topk", 1000), data)
    assert metadata["round"] == "2" and metadata["format"] == "tenzro-error-feedback/1"
    assert fb.restore_unsent([1]) == again.restore_unsent([1]) == 1
    nxt = [torch.randn(lay.numel, generator=torch.Generator().manual_seed(10)) for lay in LAYOUTS]
    for (i1, v1), (i2, v2) in zip(fb.compress(nxt, dtype), again.compress(nxt, dtype)):
        assert torch.equal(i1, i2) and torch.equal(v1, v2)
    assert all(torch.equal(a, b) for a, b in zip(fb._residual, again._residual))
    # Before any round: nothing held, nothing to restore.
    empty = ErrorFeedback(LAYOUTS, PayloadEncoding("topk", 1000))
    fresh, _ = ErrorFeedback.from_bytes(LAYOUTS, PayloadEncoding("topk", 1000), empty.to_bytes({}))
    assert fresh.residual_norm() == 0.0 and fresh.restore_unsent([0, 1]) == 0


def _edit(data: bytes, tensors: dict[str, object] | None = None, **metadata: str) -> bytes:
    """``data`` (a saved state) with tensors replaced (None: removed) and metadata changed."""
    import json

    from safetensors.torch import load, save

    n = int.from_bytes(data[:8], "little")
    meta = json.loads(data[8 : 8 + n])["__metadata__"] | metadata
    held = load(data)
    for name, tensor in (tensors or {}).items():
        if tensor is None:
            del held[name]
        else:
            held[name] = tensor  # type: ignore[assignment]
    return save(held, metadata=meta)


def _without_metadata(data: bytes) -> bytes:
    from safetensors.torch import load, save

    return save(load(data))


@pytest.mark.parametrize("edit, why", [
    (lambda d: d[:-1], "not a saved error-feedback state"),
    # a dtype safetensors' reader accepts and its torch loader cannot map: a KeyError, which
    # reached the CLI as "cannot read the node's answer" (trainer kill campaign)
    (lambda d: relabel_dtype(d, "residual.0", "F8_E8M0"), "not a saved error-feedback state: TensorFileError: .F8_E8M0"),
    (lambda d: b"\x02\x00\x00\x00\x00\x00\x00\x00[]", "not a saved error-feedback state"),
    (lambda d: _edit(d, format="tenzro-error-feedback/2"), "format is"),
    (lambda d: _edit(d, encoding='{"topk": {"density_bps": 100}}'), "saved for encoding"),
    (lambda d: _edit(d, numels="[110, 111]"), "fragments of other sizes"),
    (lambda d: _edit(d, {"residual.0": torch.zeros(110, dtype=torch.float64)}), "residual.0 must be float32"),
    (lambda d: _edit(d, {"residual.0": torch.zeros(111, dtype=torch.float64)}), "residual.0 must be float32"),
    (lambda d: _edit(d, {"residual.0": torch.zeros(110)}), r"residual.0 must be float32 \[111\]"),
    (lambda d: _without_metadata(d), "format is 'None'"),  # safetensors' own, no __metadata__ at all
    (lambda d: _edit(d, {"residual.1": torch.full((110,), float("nan"))}), "residual.1 holds NaN"),
    (lambda d: _edit(d, {"residual.0": None}), "go together"),
    (lambda d: _edit(d, {"sent_values.0": None}), "go together"),
    (lambda d: _edit(d, {"sent_indices.0": None}), "go together"),
    (lambda d: _edit(d, {"sent_indices.1": torch.arange(10)}), r"sent_indices.1 must be int64 \[11\]"),
    (lambda d: _edit(d, {"sent_values.0": torch.zeros(12).double()}), "sent_values.0 must be finite float32"),
    (lambda d: _edit(d, {"sent_values.0": torch.zeros(11)}), r"sent_values.0 must be finite float32 \[12\]"),
    (lambda d: _edit(d, {"sent_indices.1": torch.arange(11, dtype=torch.int32)}), "sent_indices.1 must be int64"),
    (lambda d: _edit(d, {"sent_indices.1": torch.arange(10, -1, -1)}), "ascend strictly"),
    (lambda d: _edit(d, {"sent_indices.1": torch.arange(100, 111)}), "ascend strictly within 0..109"),
    (lambda d: _edit(d, {"sent_values.0": torch.full((12,), float("inf"))}), "sent_values.0 must be finite"),
    (lambda d: _edit(d, {"extra": torch.zeros(1)}), "unknown tensors \\['extra'\\]"),
])
def test_a_saved_state_that_is_not_this_tasks_is_refused(edit, why: str) -> None:  # type: ignore[no-untyped-def]
    _, data = _saved_state()
    assert [lay.numel for lay in LAYOUTS] == [111, 110]
    with pytest.raises(CompressionError, match=why):
        ErrorFeedback.from_bytes(LAYOUTS, PayloadEncoding("topk", 1000), edit(data))
