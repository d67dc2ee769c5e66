"""Published test vectors for everything a third party recomputes from stored inputs: each
aggregation rule, the outer Nesterov step, the model hash and a whole round update, on inputs
made without torch's random generators (their float paths may differ between CPUs and
versions), with the digests in ``tests/vectors/determinism.json``.

Why: docs/aggregation.md promises the same bits on any run, process, thread count, chunk size
and CPU, and receipts are verified on machines the node never saw. The vectors were written on
the 2-core development machine (torch 2.13.0, numpy 2.4.6, Python 3.11) and reproduced, all 46,
on a 16-core host of an H200 machine (torch 2.11.0, numpy 2.5.2, Python 3.12) at 1, 2 and 16
torch threads (docs/aggregation.md "Test vectors"); this test recomputes them wherever the suite
runs, at the current thread count and at one thread.
``scripts/determinism_vectors.py`` prints, writes or checks them outside pytest.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from tenzro_training.aggregation import AggregationRule, aggregate
from tenzro_training.fragments import compute_model_hash
from tenzro_training.global_model import compute_initial_model, compute_round_update
from tenzro_training.outer import OuterConfig, apply_outer_step
from tenzro_training.payload import ENCODING_RAW, PayloadHeader, encode_payload
from tenzro_training.spec import TrainingTaskSpec
from tests.vectors.inputs import make_vector, round_to_bfloat16

VECTORS = Path(__file__).parent / "vectors" / "determinism.json"
K = 8
SIZES = (1, 4099, (1 << 20) + 3)
RULES = {
    "Mean": AggregationRule.mean(),
    "TrimmedMean-1250": AggregationRule.trimmed_mean(1250),
    "CoordinateMedian": AggregationRule.coordinate_median(),
    "Krum-2": AggregationRule.krum(2),
}


def _inputs(n: int) -> list[torch.Tensor]:
    grads = [torch.from_numpy(make_vector(f"grad/{n}/{i}", n)) for i in range(K)]
    # Two inputs arrive as 16-bit payloads: each widens to float32 exactly inside aggregate().
    return [grads[0].to(torch.bfloat16), grads[1].to(torch.float16), *grads[2:]]


def _digest(t: torch.Tensor) -> str:
    return hashlib.sha256(t.detach().contiguous().to(torch.float32).numpy().astype("<f4").tobytes()).hexdigest()


def _round_update_vectors() -> dict[str, str]:
    """A whole finalize as the node runs it (payload decode, aggregation, in-place outer step
    with reused buffers, model hash) on a small two-fragment model."""
    base = json.loads((Path(__file__).parent.parent / "tenzro_training/data/timesfm-200m-task.json").read_text())
    out = {}
    state = {
        "a.weight": torch.from_numpy(make_vector("state/a", 3 * 1000)).reshape(3, 1000),
        "b.bias": torch.from_numpy(make_vector("state/b", 517)),
        "c.norm": torch.from_numpy(make_vector("state/c", 64)).to(torch.bfloat16).float(),
    }
    for name, rule in (("Mean", "Mean"), ("TrimmedMean-1250", {"TrimmedMean": {"alpha_bps": 1250}}),
                       ("Krum-2", {"Krum": {"f": 2}})):
        doc = dict(base, trainer_count=K, quorum=K, aggregation=rule, max_rounds=4)
        doc["architecture"] = dict(base["architecture"], fragment_count=2)
        spec = TrainingTaskSpec.from_dict(doc)
        initial = compute_initial_model(state, 2)
        inputs = []
        for lay in initial.model.layouts:
            header = PayloadHeader(spec.task_id, 0, lay.index, ENCODING_RAW, lay.layout_hash())
            subs = []
            for t in range(K):
                flat = torch.from_numpy(make_vector(f"payload/{lay.index}/{t}", lay.numel))
                subs.append((bytes([t + 1]) * 20, encode_payload(header, lay, flat, "bfloat16" if t == 0 else "float32")))
            inputs.append(subs)
        momentum = [torch.from_numpy(make_vector(f"momentum/{lay.index}", lay.numel)) for lay in initial.model.layouts]
        update = compute_round_update(spec, initial.model, 0, inputs, [w.clone() for w in initial.weights], momentum,
                                      max_payload_bytes=1 << 20, in_place=True)
        out[f"round_update/{name}/model_hash"] = update.model_hash.hex()
        out[f"round_update/{name}/outcomes"] = hashlib.sha256(
            b"".join(o.aggregate_hash + o.report_hash for o in update.outcomes)).hexdigest()
    return out


def compute_vectors(sizes: tuple[int, ...] = SIZES) -> dict[str, str]:
    """Every vector's name and SHA-256 hex digest."""
    out: dict[str, str] = {}
    cfg = OuterConfig()  # lr 0.7, momentum 0.9 (SPEC.md)
    for n in sizes:
        grads = _inputs(n)
        for name, rule in RULES.items():
            result = aggregate(rule, grads)
            out[f"aggregate/{name}/{n}"] = _digest(result.tensor)
            out[f"report/{name}/{n}"] = result.report.report_hash().hex()
        for k in (3, 7):  # K=8 divides by a power of two, exact however the division is written
            out[f"aggregate/Mean-K{k}/{n}"] = _digest(aggregate(RULES["Mean"], grads[:k]).tensor)
        multi = aggregate(RULES["Krum-2"], grads, multi_krum_m=3)
        out[f"aggregate/MultiKrum-2-3/{n}"] = _digest(multi.tensor)
        w = torch.from_numpy(make_vector(f"weights/{n}", n))
        m = torch.from_numpy(make_vector(f"momentum/{n}", n))
        new_w, new_m = apply_outer_step(w, m, aggregate(RULES["Mean"], grads).tensor, cfg)
        out[f"outer_step/weights/{n}"] = _digest(new_w)
        out[f"outer_step/momentum/{n}"] = _digest(new_m)
    state = {
        "z.weight": torch.from_numpy(make_vector("model/z", 4099)).reshape(1, 4099),
        "a.half": torch.from_numpy(make_vector("model/a", 300)).to(torch.bfloat16),
        "m.empty": torch.zeros(0, 3),
    }
    out["model_hash"] = compute_model_hash(state).hex()
    out.update(_round_update_vectors())
    return dict(sorted(out.items()))


def _expected() -> dict[str, str]:
    return json.loads(VECTORS.read_text())["vectors"]


def test_the_inputs_are_made_without_torchs_generators() -> None:
    """The input maker itself is pinned: its first values, bit for bit. Its numpy bf16 rounding
    is torch's."""
    v = make_vector("grad/4099/3", 4099)
    assert v.dtype == np.float32 and v[1:2].astype("<f4").tobytes() == b"\x00\x00\x00\x80" and v[2] == np.float32(1e-40)
    assert hashlib.sha256(v.astype("<f4").tobytes()).hexdigest() == _expected()["inputs/grad/4099/3"]
    assert np.array_equal(round_to_bfloat16(v).view(np.uint32),
                          torch.from_numpy(v).to(torch.bfloat16).float().numpy().view(np.uint32))


@pytest.mark.parametrize("threads", ["current", 1])
def test_every_vector_is_reproduced(threads: object) -> None:
    before = torch.get_num_threads()
    if threads != "current":
        torch.set_num_threads(int(threads))  # type: ignore[call-overload]
    try:
        got = compute_vectors()
    finally:
        torch.set_num_threads(before)
    expected = {k: v for k, v in _expected().items() if not k.startswith("inputs/")}
    assert got.keys() == expected.keys()
    assert [k for k in got if got[k] != expected[k]] == []


def test_the_script_checks_them_at_several_thread_counts() -> None:
    import subprocess
    import sys

    done = subprocess.run([sys.executable, str(Path(__file__).parent.parent / "scripts" / "determinism_vectors.py"),
                           "--threads", "1,2"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert '"mismatches": 0' in done.stdout and '"threads": [1, 2]' in done.stdout
