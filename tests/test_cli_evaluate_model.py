"""``tenzro train evaluate-model``: a sponsor scores model files (init-checkpoint's and a trained
one) on its spec's held-out windows, as a table or JSON; every bad input is one line on stderr,
exit status 2 and nothing on stdout. Real torch, the shipped corpus and the tiny model."""

from __future__ import annotations

import hashlib
import json
import math
import os
from pathlib import Path
from typing import Any

import pytest
import safetensors.torch
import torch

from tenzro_training import cli
from tenzro_training.cli import EXIT_OK, EXIT_USAGE
from tenzro_training.fragments import compute_model_hash
from tenzro_training.trainer.data import load_corpus, shard_windows, validation_batch
from tenzro_training.trainer.inner import InnerConfig, evaluate, run_inner_loop
from tenzro_training.trainer.model import create_init_checkpoint, save_checkpoint
from tests.trainer.conftest import TINY_MODEL

TINY_METADATA = {"context_len": 32, "horizon": 8, "patch_len": 8, "d_model": 32, "n_layers": 2, "n_heads": 4, "d_ff": 64}


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(["train", "evaluate-model", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def write_spec(path: Path, **changes: Any) -> Path:
    """The shipped dev spec with the tiny model and ``changes`` (top-level keys)."""
    doc = json.loads((Path(cli.__file__).parents[1] / "data" / "dev-task.json").read_text())
    doc["architecture"]["metadata"] = dict(TINY_METADATA)
    doc.update(changes)
    path.write_text(json.dumps(doc))
    return path


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A spec naming its init checkpoint (written by ``init-checkpoint --spec-out``), and a model
    trained eight inner steps from that checkpoint."""
    root = tmp_path_factory.mktemp("evaluate")
    bare = write_spec(root / "bare.json")
    assert cli.main(["train", "init-checkpoint", "--spec", str(bare), "--out", str(root / "init.safetensors"),
                     "--spec-out", str(root / "spec.json")]) == EXIT_OK
    init = create_init_checkpoint(TINY_MODEL, 0)
    shard = shard_windows(load_corpus(), 0, 3, TINY_MODEL.context_len, TINY_MODEL.horizon)
    trained = run_inner_loop(init, InnerConfig(inner_steps=8, lr=1e-3, batch_size=32), TINY_MODEL, shard, 0, 0).state
    save_checkpoint(trained, root / "trained.safetensors")
    return {"spec": root / "spec.json", "bare": bare, "init": root / "init.safetensors",
            "trained": root / "trained.safetensors"}


def test_evaluate_model_json(files: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "--spec", str(files["spec"]), "--with-init", "--model", str(files["trained"]), "--json")
    assert code == EXIT_OK, err
    doc = json.loads(out)
    assert set(doc) == {"task_id", "spec_hash", "dataset_ref", "dataset_hash", "device", "metric", "windows",
                        "context_len", "horizon", "models", "baselines"}
    assert (doc["task_id"], doc["device"], doc["metric"]) == ("dev-timesfm-1", "cpu", "mean normalised MSE")
    assert (doc["windows"], doc["context_len"], doc["horizon"]) == (150, 32, 8)
    init_entry, trained_entry = doc["models"]
    assert init_entry["name"] == "init_checkpoint" and trained_entry["name"] == str(files["trained"])
    assert init_entry["file"] == str(files["init"].resolve())
    val = validation_batch(load_corpus(), 32, 8)
    for entry, path in ((init_entry, files["init"]), (trained_entry, files["trained"])):
        data = path.read_bytes()
        state = safetensors.torch.load(data)
        assert set(entry) == {"name", "file", "sha256", "model_hash", "loss"}
        assert entry["sha256"] == "0x" + hashlib.sha256(data).hexdigest()
        assert entry["model_hash"] == "0x" + compute_model_hash(state).hex()
        assert entry["loss"] == evaluate(state, TINY_MODEL, val)
    assert trained_entry["loss"] < 0.95 * init_entry["loss"]
    last, seasonal = doc["baselines"]
    assert last["name"] == "last_value" and math.isfinite(last["loss"]) and last["note"] == ""
    assert seasonal["name"] == "seasonal_naive" and seasonal["loss"] is None and "co2's season" in seasonal["note"]


def test_evaluate_model_table(files: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "--spec", str(files["spec"]), "--model", str(files["init"]))
    assert code == EXIT_OK and err == ""
    lines = out.splitlines()
    assert lines[0] == "task_id   dev-timesfm-1"
    assert lines[2] == "windows   150 held out, context 32, horizon 8"
    assert lines[4] == "validation loss (mean normalised MSE; lower is better)"
    assert lines[5].split()[0] == str(files["init"]) and lines[5].split()[2] == "model_hash"
    assert lines[6].split()[:2] == ["baseline", "last_value"] and lines[6].split()[2] == "1.4803"
    assert lines[7].split()[:3] == ["baseline", "seasonal_naive", "-"] and "(co2's season of 52 values" in lines[7]


def _model_with(files: dict[str, Path], tmp_path: Path, change: Any) -> Path:
    state = dict(safetensors.torch.load(files["init"].read_bytes()))
    change(state)
    path = tmp_path / "model.safetensors"
    safetensors.torch.save_file(state, str(path))
    return path


@pytest.mark.parametrize(("case", "message"), [
    ("missing file", "cannot read model {tmp}/absent.safetensors: cannot open: No such file or directory"),
    ("directory", "cannot read model {tmp}: not a regular file"),
    ("fifo", "cannot read model {tmp}/fifo: not a regular file"),
    ("not safetensors", "model {tmp}/junk.safetensors: not a valid safetensors file"),
    ("missing tensor", "model {tmp}/model.safetensors does not fit the spec's architecture: missing: head.bias"),
    ("other shape", "does not fit the spec's architecture: other shapes: head.weight (4, 32) where the model has (8, 32)"),
    ("wrong dtype", "model {tmp}/model.safetensors: tensor 'head.bias': dtype torch.float64 is not one of"),
    ("dataset hash", "dataset hash is 0xa338b632e57671843f4eec915e05f65deea78dff8c5612c6aa182db5fedd4b17, "
                     "the task expects 0x1111111111111111111111111111111111111111111111111111111111111111"),
    ("invalid spec", "quorum: must be <= trainer_count"),
    ("no model", "nothing to evaluate: pass --model FILE (repeatable) and/or --with-init"),
    ("no init checkpoint", "--with-init: the spec names no architecture.metadata.init_checkpoint"),
    ("init checkpoint changed", "init checkpoint file://{tmp}/init.safetensors: sha256 is 0x"),
    ("no such device", "device 'cuda:99'"),
])
def test_invalid_inputs_exit_2_with_one_line(
    files: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str, message: str
) -> None:
    spec, model = files["spec"], files["init"]
    extra: list[str] = []
    if case == "missing file":
        model = tmp_path / "absent.safetensors"
    elif case == "directory":
        model = tmp_path
    elif case == "fifo":
        model = tmp_path / "fifo"
        os.mkfifo(model)
    elif case == "not safetensors":
        model = tmp_path / "junk.safetensors"
        model.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json at all}")
    elif case == "missing tensor":
        model = _model_with(files, tmp_path, lambda s: s.pop("head.bias"))
    elif case == "other shape":
        model = _model_with(files, tmp_path, lambda s: s.update({"head.weight": torch.zeros(4, 32)}))
    elif case == "wrong dtype":
        model = _model_with(files, tmp_path, lambda s: s.update({"head.bias": s["head.bias"].double()}))
    elif case == "dataset hash":
        spec = write_spec(tmp_path / "spec.json", dataset_hash="0x" + "11" * 32)
    elif case == "invalid spec":
        spec = write_spec(tmp_path / "spec.json", quorum=9)
    elif case == "no init checkpoint":
        spec, extra = files["bare"], ["--with-init"]
    elif case == "init checkpoint changed":
        doc = json.loads(files["spec"].read_text())
        (tmp_path / "init.safetensors").write_bytes(files["trained"].read_bytes())
        doc["architecture"]["metadata"]["init_checkpoint"]["uri"] = (tmp_path / "init.safetensors").as_uri()
        spec, extra = tmp_path / "spec.json", ["--with-init"]
        spec.write_text(json.dumps(doc))
    elif case == "no such device":
        extra = ["--device", "cuda:99"]
    models = [] if case in ("no model", "no init checkpoint", "init checkpoint changed") else ["--model", str(model)]
    code, out, err = run(capsys, "--spec", str(spec), *models, *extra)
    assert code == EXIT_USAGE and out == ""
    assert err.startswith("tenzro: ") and err.count("\n") == 1, err
    assert message.format(tmp=tmp_path) in err, err


def test_invalid_empty_model_path_is_a_usage_error(files: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        run(capsys, "--spec", str(files["spec"]), "--model", "")
    assert info.value.code == EXIT_USAGE and "expected a file path" in capsys.readouterr().err


def test_a_model_exported_from_another_task_is_named_in_a_note(files: dict[str, Path], tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    """export-model writes the run's task id and final model hash into the file's metadata; a
    model of another run (every dev run shares the architecture and the data, so the shapes
    fit) was scored without a word, as if it were this spec's (review). It is still scored (a
    sponsor may compare runs on one spec), with a note on stderr; so is a file whose weights no
    longer hash to the model hash it claims."""
    state = safetensors.torch.load(files["init"].read_bytes())
    other = tmp_path / "other.safetensors"
    safetensors.torch.save_file(state, str(other), metadata={"format": "pt", "tenzro.task_id": "another-run-7",
                                                           "tenzro.model_hash": "0x" + "11" * 32})
    same = tmp_path / "same.safetensors"
    safetensors.torch.save_file(state, str(same), metadata={"format": "pt", "tenzro.task_id": "dev-timesfm-1",
                                                          "tenzro.model_hash": "0x" + compute_model_hash(state).hex()})
    code, out, err = run(capsys, "--spec", str(files["spec"]), "--model", str(other), "--model", str(same), "--json")
    assert code == EXIT_OK, err
    assert len(json.loads(out)["models"]) == 2
    notes = err.splitlines()
    assert notes == [
        f"tenzro: note: model {other} was exported from task another-run-7, not the spec's dev-timesfm-1",
        f"tenzro: note: model {other} says its model hash is 0x{'11' * 32}; its weights hash to "
        f"0x{compute_model_hash(state).hex()}",
    ]
