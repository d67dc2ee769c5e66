"""The clean-room verifier (written from docs/ alone) reproduces every committed value of real runs.

A real ``tenzro node --dev`` process runs four small sealed runs with edge-case gradients (signed
zeros, subnormals, ties, cancellation), one per aggregation rule:

- ``cr-mean``: Mean over a bf16 checkpoint with bf16 payloads;
- ``cr-trim``: TrimmedMean 2500 bps, a trainer absent in round 1 (t = 1, then t = 0) and a trainer
  that equivocates in round 2 and is slashed mid-run;
- ``cr-median``: CoordinateMedian with fp16 payloads, K = 3 then K = 4 (odd and even);
- ``cr-krum``: Krum f = 1 with two identical payloads in round 1 (D = 0, tied scores);
- ``cr-topk``: TrimmedMean 2500 bps in a run whose spec selects the topk encoding at 2500 bps
  (docs/payload.md "topk": k = 245 of 977 values, 244 of 976): three trainers send top-k with
  error feedback as fp32, bf16 and fp16 topk payloads, the fourth sends raw payloads (always
  accepted);
- ``cr-q8``: CoordinateMedian (K = 4, even) in a run whose spec selects the q8 encoding in blocks of 64 (docs/payload.md
  "q8": 16 blocks for 977 values, the last of 17 values): three trainers quantise with error
  feedback, their scales as fp32, bf16 and fp16, the fourth sends raw payloads.

The node is stopped, then ``cleanroom_verifier.py`` runs in a subprocess that cannot import the
project (``python -S`` over a copy of site-packages without it, a cwd outside the repo, the
verifier copied out of the repo, ``--require-no-project``), and must pass every check. A second
run with a mutation control (``VERIFY_MUTATE=numpy_mean``) must fail: the test can fail. So must
the topk controls (``topk_reversed``: the values scattered in reverse order; ``topk_drop_one``:
the last value left out), on ``cr-topk`` alone, and the q8 controls (``q8_unsigned``: the int8
values read as unsigned; ``q8_scale_per_tensor``: one scale for every block), on ``cr-q8`` alone.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import site
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from tenzro_training.compression import ErrorFeedback, PayloadEncoding
from tenzro_training.payload import ENCODING_RAW, PayloadHeader, encode_payload
from tenzro_training.trainer.inner import make_payloads
from tests.e2e.conftest import NodeProcess, RpcFailure, Task, TinyModel, make_spec, rpc, rpc_reply, start_node, write_config

pytestmark = pytest.mark.slow

VERIFIER = Path(__file__).with_name("cleanroom_verifier.py")
PROJECT_PACKAGES = ("tenzro_training", "storage", "rpc", "precompile")
STAKE = 10**18
STRAGGLER_WINDOW_OPEN = 1316  # docs/rpc.md


# --- inputs ---------------------------------------------------------------------------------------


def write_checkpoint(path: Path, dtype: str) -> TinyModel:
    """A small model with awkward names and values: a scalar, an empty tensor, a non-ASCII name,
    an upper-case name that sorts first by bytes, and -0.0 / a subnormal in the weights."""
    from safetensors.torch import save_file

    rng = np.random.default_rng(7)
    tensors = {
        "blocks.0.weight": rng.standard_normal((30, 40)) * 0.1,
        "blocks.0.bias": rng.standard_normal(40) * 0.01,
        "blocks.1.weight": rng.standard_normal((40, 40)) * 0.1,
        "Emb": rng.standard_normal((10, 8)),
        "norm.scale": np.array(1.0),
        "empty": np.zeros((0, 4)),
        "z_\u00e9t\u00e9": rng.standard_normal(5),
        "a-b": np.array([-0.0, 1e-40, 3.0]),
    }
    torch_dtype = torch.bfloat16 if dtype == "bf16" else torch.float32
    save_file({k: torch.from_numpy(np.asarray(v, dtype=np.float32)).to(torch_dtype) for k, v in tensors.items()}, str(path))
    return TinyModel(path, "0x" + hashlib.sha256(path.read_bytes()).hexdigest())


EDGE_ROWS = [
    [-0.0, -0.0, -0.0, -0.0, -0.0],  # all negative zero
    [0.0, -0.0, 0.0, -0.0, 0.0],  # mixed zeros
    [1e-40, -3e-41, 7e-45, 2e-39, -1e-45],  # fp32 subnormals
    [0.25, 0.25, 0.25, 0.25, 0.25],  # ties
    [1.0, 1e-8, -1.0, 3e-8, 5e-9],  # cancellation: the summation order matters
    [3.0, 1e-7, 1e-7, 1e-7, -2.9999998],
    [1 / 3, 2 / 3, -1 / 7, 1.1, 1e-3],
    [1e4, -1e4, 12345.678, -0.5, 9999.99],  # large, still finite in fp16
    [1.5, 2.5, -1.5, -2.5, 0.5],
]


def gradient(n: int, trainer: int, rnd: int, fragment: int) -> np.ndarray:
    g = (np.random.default_rng(1000 * trainer + 100 * rnd + fragment + 17).standard_normal(n) * 1e-3).astype(np.float32)
    for i, row in enumerate(EDGE_ROWS[:n]):
        g[i] = np.float32(row[trainer % 5])
    return g


# --- one run over JSON-RPC ---------------------------------------------------------------------------


def new_run(node: NodeProcess, model: TinyModel, task_id: str, *, dtype: str, fragments: int,
            encoding: Any = None, **changes: Any) -> Task:
    """``encoding``: the spec's ``architecture.metadata.outer_gradient_encoding`` (None: absent, raw)."""
    from tenzro_training.cli.layouts import compute_task_layouts
    from tenzro_training.spec import TrainingTaskSpec

    accounts = node.accounts
    spec = make_spec(model, task_id, accounts["sponsor:0"]["address"], grace_window_ms=300, **changes)
    metadata = {"context_len": 16, "horizon": 4, "outer_lr": 0.7, "outer_momentum": 0.9,
                "init_checkpoint": {"uri": model.checkpoint.as_uri(), "sha256": model.sha256}}
    if encoding is not None:
        metadata["outer_gradient_encoding"] = encoding
    spec["architecture"].update(param_count=2929, fragment_count=fragments, dtype=dtype, metadata=metadata)
    return Task(node.url, spec, accounts, compute_task_layouts(TrainingTaskSpec.from_dict(spec)))


def submit(task: Task, who: str, rnd: int, fragment: int, values: np.ndarray, dtype: str) -> dict[str, Any]:
    layout = task.layouts[fragment]
    header = PayloadHeader(task.task_id, rnd, fragment, ENCODING_RAW, layout.layout_hash())
    payload = encode_payload(header, layout, torch.from_numpy(values), dtype)
    return rpc_reply(task.url, "tenzro_training_submitOuterGradient", task.submit_params(who, rnd, fragment, payload))


def submit_payload(task: Task, who: str, rnd: int, fragment: int, payload: bytes) -> dict[str, Any]:
    return rpc_reply(task.url, "tenzro_training_submitOuterGradient", task.submit_params(who, rnd, fragment, payload))


def finalize(task: Task, rnd: int) -> dict[str, Any]:
    """The current syncer finalizes, retrying while the straggler window is open (absent trainers)."""
    deadline = time.monotonic() + 30
    while True:
        try:
            return task.finalize(task.who_is(task.get()["syncer"]), rnd)
        except RpcFailure as exc:
            if exc.error.get("code") != STRAGGLER_WINDOW_OPEN or time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def run_sealed(
    task: Task, out_dir: Path, *, trainers: int, rounds: int, payload_dtype: str,
    absent: frozenset[tuple[int, int]] = frozenset(), copies: dict[tuple[int, int], int] | None = None,
    equivocate: tuple[int, int] | None = None, compressed: dict[int, str] | None = None,
) -> None:
    """Post, enroll, submit every round, finalize; save getRun and getReceipt for the verifier.

    ``absent``: (round, trainer) pairs that do not submit; ``copies``: (round, trainer) -> the
    trainer whose gradient it sends; ``equivocate``: (round, trainer) that signs two payloads for
    fragment 0 (the node slashes it; it submits nothing more); ``compressed``: trainer -> the dtype
    of the payloads in the spec's topk or q8 encoding it sends (with error feedback, as a trainer
    process makes them: ``make_payloads``), the others sending raw ``payload_dtype`` payloads."""
    names = [f"trainer:{i}" for i in range(trainers)]
    if compressed:
        from tenzro_training.spec import TrainingTaskSpec

        encoding = PayloadEncoding.from_spec(TrainingTaskSpec.from_dict(task.spec))
        assert encoding.has_feedback
        feedback = {t: ErrorFeedback(task.layouts, encoding) for t in compressed}
    task.post()
    task.wait_status("Enrolling")
    for who in names:
        task.enroll(who, stake=STAKE)
    task.wait_status("Training")
    slashed: set[int] = set()
    for rnd in range(rounds):
        for t, who in enumerate(names):
            if (rnd, t) in absent or t in slashed:
                continue
            source = (copies or {}).get((rnd, t), t)
            if compressed and t in compressed:
                grads = [torch.from_numpy(gradient(lay.numel, source, rnd, f)) for f, lay in enumerate(task.layouts)]
                payloads = make_payloads(task.task_id, rnd, task.layouts, grads, compressed[t], feedback[t])
                for f, payload in enumerate(payloads):
                    assert "result" in submit_payload(task, who, rnd, f, payload)
                continue
            for f, layout in enumerate(task.layouts):
                values = gradient(layout.numel, source, rnd, f)
                assert "result" in submit(task, who, rnd, f, values, payload_dtype)
                if equivocate == (rnd, t):
                    values[-1] += np.float32(1e-3)
                    assert "error" in submit(task, who, rnd, f, values, payload_dtype)
                    slashed.add(t)
                    break
        assert finalize(task, rnd)["round"] == rnd
    view = task.wait_status("Sealed")
    assert sum(1 for t in view["trainers"] if t["slashed"]) == len(slashed)
    (out_dir / f"{task.task_id}.run.json").write_text(json.dumps(view))
    receipt = rpc(task.url, "tenzro_training_getReceipt", {"task_id": task.task_id})
    (out_dir / f"{task.task_id}.receipt.json").write_text(json.dumps(receipt))


# --- the verifier in a process that cannot import the project ----------------------------------------


def is_project_entry(name: str) -> bool:
    top = re.split(r"[-.]", name, maxsplit=1)[0].lower()
    return top in PROJECT_PACKAGES or name.startswith("__editable__") or name.endswith(".pth")


def project_free_site(target: Path) -> Path:
    """site-packages as symlinks, minus the project (editable finder and .pth files included)."""
    target.mkdir()
    user = [site.getusersitepackages()] if site.ENABLE_USER_SITE else []  # a pip --user install
    for sp in [*site.getsitepackages(), *user]:
        if not Path(sp).is_dir():
            continue
        for entry in Path(sp).iterdir():
            if not is_project_entry(entry.name) and not (target / entry.name).exists():
                (target / entry.name).symlink_to(entry)
    return target


def isolated_env(site_dir: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VERIFY_"))}
    return {**env, "PYTHONPATH": str(site_dir), "PYTHONNOUSERSITE": "1", "OMP_NUM_THREADS": "1", **extra}


def run_isolated(args: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-S", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def summary(output: str) -> dict[str, int]:
    line = next(line for line in output.splitlines() if line.startswith("SUMMARY "))
    return {k: int(v) for k, v in (kv.split("=") for kv in line.split()[1:])}


RUNS = ("cr-krum", "cr-mean", "cr-median", "cr-q8", "cr-topk", "cr-trim")
DECODING_MUTATIONS = {"topk_reversed": "cr-topk", "topk_drop_one": "cr-topk", "q8_unsigned": "cr-q8",
                      "q8_scale_per_tensor": "cr-q8"}


def test_cleanroom_verifier_reproduces_real_sealed_runs(tmp_path: Path) -> None:
    started = time.monotonic()
    ckpt_dir, json_dir = tmp_path / "ckpt", tmp_path / "answers"
    ckpt_dir.mkdir()
    json_dir.mkdir()
    fp32_model = write_checkpoint(ckpt_dir / "init-fp32.safetensors", "fp32")
    bf16_model = write_checkpoint(ckpt_dir / "init-bf16.safetensors", "bf16")
    data_dir = tmp_path / "node" / "data"
    # Values of 4 KiB and more in files of their own (docs/storage.md "Large values"): this
    # model's fp32 fragments and payloads go there, its 16-bit payloads stay in their keys, so
    # the verifier reads both forms.
    node = start_node(data_dir, write_config(tmp_path / "node.json", external_value_bytes=4096), log_name="node")
    try:
        run_sealed(new_run(node, bf16_model, "cr-mean", dtype="bf16", fragments=3, trainer_count=3, quorum=3),
                   json_dir, trainers=3, rounds=2, payload_dtype="bfloat16")
        run_sealed(new_run(node, fp32_model, "cr-trim", dtype="fp32", fragments=3, trainer_count=4, quorum=3,
                           max_rounds=3, aggregation={"TrimmedMean": {"alpha_bps": 2500}}),
                   json_dir, trainers=4, rounds=3, payload_dtype="float32", absent=frozenset({(1, 2)}), equivocate=(2, 1))
        run_sealed(new_run(node, fp32_model, "cr-median", dtype="fp32", fragments=3, trainer_count=4, quorum=3,
                           aggregation="CoordinateMedian"),
                   json_dir, trainers=4, rounds=2, payload_dtype="float16", absent=frozenset({(0, 3)}))
        run_sealed(new_run(node, fp32_model, "cr-krum", dtype="fp32", fragments=2, trainer_count=5, quorum=5,
                           aggregation={"Krum": {"f": 1}}),
                   json_dir, trainers=5, rounds=2, payload_dtype="float32", copies={(1, 1): 0})
        run_sealed(new_run(node, fp32_model, "cr-topk", dtype="fp32", fragments=3, trainer_count=4, quorum=4,
                           aggregation={"TrimmedMean": {"alpha_bps": 2500}},
                           encoding={"topk": {"density_bps": 2500}}),
                   json_dir, trainers=4, rounds=2, payload_dtype="float32",
                   compressed={0: "float32", 1: "bfloat16", 2: "float16"})
        run_sealed(new_run(node, fp32_model, "cr-q8", dtype="fp32", fragments=3, trainer_count=4, quorum=4,
                           aggregation="CoordinateMedian", encoding={"q8": {"block_size": 64, "feedback_decay": 1}}),
                   json_dir, trainers=4, rounds=2, payload_dtype="bfloat16",
                   compressed={0: "float32", 1: "bfloat16", 2: "float16"})
    finally:
        code = node.stop()
    assert code == 0, node.stderr()
    assert "Traceback" not in node.stderr(), node.stderr()
    from storage.rocks import RocksStore
    from storage.schema import CF_MODEL_STATE, CF_SUBMISSIONS, PAYLOAD_KEY_MARK

    with RocksStore(data_dir / "db", read_only=True) as store:
        large = len(list(store.keys(CF_SUBMISSIONS, PAYLOAD_KEY_MARK))) + len(list(store.keys(CF_MODEL_STATE)))
    in_files = len([p for p in (data_dir / "db" / "values").iterdir() if not p.name.startswith(".")])
    assert 0 < in_files < large, (in_files, large)
    produced = time.monotonic()

    work = tmp_path / "outside"  # neither the repo nor anything of it on sys.path
    work.mkdir()
    verifier = shutil.copy(VERIFIER, work / VERIFIER.name)
    env = isolated_env(project_free_site(tmp_path / "site"))
    probe = run_isolated(["-c", "import tenzro_training"], work, env)
    assert probe.returncode != 0 and "ModuleNotFoundError" in probe.stderr, probe
    args = [str(verifier), "--require-no-project", "--db", str(data_dir / "db"), "--data-dir", str(data_dir),
            "--json-dir", str(json_dir)]

    clean = run_isolated(args, work, env)
    assert clean.returncode == 0, clean.stdout[-6000:] + clean.stderr[-3000:]
    counts = summary(clean.stdout)
    assert counts["runs"] == counts["runs_passed"] == len(RUNS), counts
    assert counts["failed"] == 0 and counts["notes"] == 0 and counts["checks"] > 300, counts
    encoding_lines = [line for line in clean.stdout.splitlines() if "'Encodings': outer_gradient_encoding" in line
                      and "(" in line.rsplit("65536", 1)[-1]]
    assert encoding_lines == [f"  [OK  ] payload.md 'Encodings': outer_gradient_encoding absent, \"raw\", topk with "
                              f"1 <= density_bps <= 5000 or q8 with 16 <= block_size <= 65536 ({what})"
                              for what in ("q8 64", "topk 2500")], encoding_lines
    assert [line.split()[1] for line in clean.stdout.splitlines() if line.startswith("RUN ")] == list(RUNS)

    mutated = run_isolated(args, work, {**env, "VERIFY_MUTATE": "numpy_mean"})
    assert mutated.returncode == 1, mutated.stdout[-3000:] + mutated.stderr[-3000:]
    counts = summary(mutated.stdout)
    assert counts["failed"] > 0 and counts["runs_passed"] == len(RUNS) - 1, counts
    failures = [line for line in mutated.stdout.splitlines() if line.startswith("FAIL ")]
    assert failures and all(line.startswith("FAIL cr-mean:") and "aggregate hash" in line for line in failures), failures

    for mutation, run in DECODING_MUTATIONS.items():  # a wrong decoding is caught, on its run alone
        mutated = run_isolated(args, work, {**env, "VERIFY_MUTATE": mutation})
        assert mutated.returncode == 1, mutation + mutated.stdout[-3000:] + mutated.stderr[-3000:]
        counts = summary(mutated.stdout)
        assert counts["failed"] > 0 and counts["runs_passed"] == len(RUNS) - 1, (mutation, counts)
        failures = [line for line in mutated.stdout.splitlines() if line.startswith("FAIL ")]
        assert all(line.startswith(f"FAIL {run}:") for line in failures), (mutation, failures)
        assert sum("aggregate hash" in line for line in failures) == 2 * 3, (mutation, failures)  # every round, fragment
    print(f"produced in {produced - started:.1f}s, verified twice in {time.monotonic() - produced:.1f}s; "
          + next(line for line in clean.stdout.splitlines() if line.startswith("SUMMARY ")))
