"""A sealed run's model: export-model (from a data dir, or downloaded and checked against the
verified receipt) and evaluate-model (held-out loss beside simple forecasts)."""

from __future__ import annotations

import argparse
import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tenzro_training.cli.artifacts import artifact_path, fetch_when_room, why_unavailable
from tenzro_training.cli.client import RpcClient
from tenzro_training.cli.exits import EXIT_RPC_ERROR, CliError
from tenzro_training.cli.files import MAX_CHECKPOINT_FILE_BYTES, checkpoint_path, read_spec_file, write_out
from tenzro_training.cli.output import emit, kv, note
from tenzro_training.cli.verify_commands import check_receipt_of
from tenzro_training.errors import TenzroError

if TYPE_CHECKING:
    from storage.interface import KVStore


@contextlib.contextmanager
def _read_only_store(data_dir: Path) -> Iterator[KVStore]:
    """The node's store opened read-only: it works beside a running node, and writes nothing
    (through a node service it had marked an older store for this version, which the old
    version then refused: upgrade probe)."""
    from storage import open_store
    from storage.interface import StorageError

    try:
        store = open_store(data_dir / "db", create=False, read_only=True)
    except StorageError as exc:
        raise CliError(str(exc)) from None
    try:
        yield store
    finally:
        store.close()


def _export_from_store(data_dir: Path, task_id: str) -> bytes:
    """The sealed model file of ``task_id`` rebuilt from the store's final weights (checked
    against the run's final_model_hash on the way)."""
    from tenzro_training.node.run_store import read_final_model_file

    with _read_only_store(data_dir) as store:
        try:
            return read_final_model_file(store, task_id)
        except TenzroError as exc:
            raise CliError(f"cannot export {task_id}: {exc}", EXIT_RPC_ERROR) from None


def _check_model_file_against_store(data_dir: Path, task_id: str, model_file: Path, model_hash: bytes) -> None:
    """A model file in ``D/models`` is the node's copy of what the store holds; a damaged one (a
    bad disk, an edit) must not be exported as the run's model. Exit 1 unless its weights hash to
    the stored run's final_model_hash (docs promised this check; until 2026-11-27 only
    ``--check-receipt`` compared anything: docs audit)."""
    from tenzro_training.node.run_store import read_sealed_run

    with _read_only_store(data_dir) as store:
        try:
            run = read_sealed_run(store, task_id)
        except TenzroError as exc:
            raise CliError(f"cannot export {task_id}: {exc}", EXIT_RPC_ERROR) from None
    assert run.final_record is not None  # read_sealed_run: a sealed run has its final record
    expected = run.final_record.final_model_hash
    if model_hash != expected:
        raise CliError(f"{model_file} hashes to 0x{model_hash.hex()}, the run's final_model_hash is "
                       f"0x{expected.hex()}: not written (a damaged file: remove it and export again to rebuild "
                       "it from the stored weights)", EXIT_RPC_ERROR)


def cmd_export_model(args: argparse.Namespace) -> None:
    from tenzro_training.fragments import compute_model_hash
    from tenzro_training.tensorfile import load_tensors

    from storage import schema
    from storage.files import NotReadable, read_regular_file

    try:
        schema.run_key(args.task_id)  # a valid task id is a file name: no "/" to leave models/
    except schema.KeyFormatError as exc:
        raise CliError(str(exc)) from None
    if args.data_dir is None:
        _export_from_node(args)
        return
    data_dir = Path(args.data_dir)
    model_file = data_dir / "models" / f"{args.task_id}.safetensors"
    has_store = (data_dir / "db").is_dir()
    from_file = model_file.exists()
    if from_file:
        try:
            data = read_regular_file(model_file, MAX_CHECKPOINT_FILE_BYTES)
        except NotReadable as exc:
            raise CliError(f"cannot read {model_file}: {exc.reason}") from None
    elif has_store:
        data = _export_from_store(data_dir, args.task_id)
    else:
        raise CliError(f"{data_dir} is not a node data directory (no db/)")
    try:
        model_hash = compute_model_hash(load_tensors(data))
    except Exception as exc:  # a damaged file: refused by the parse or by the model hash's checks
        raise CliError(f"{model_file}: not a readable safetensors model: {exc}") from None
    if from_file and has_store:
        _check_model_file_against_store(data_dir, args.task_id, model_file, model_hash)
    result = {"task_id": args.task_id, "out": str(args.out), "bytes": len(data), "model_hash": "0x" + model_hash.hex()}
    if args.check_receipt:
        expected = "0x" + check_receipt_of(RpcClient(args.rpc), args.task_id).final_model_hash.hex()
        if expected != result["model_hash"]:
            raise CliError(f"model hash {result['model_hash']} differs from the receipt's {expected}", EXIT_RPC_ERROR)
        result["receipt_checked"] = True
    write_out(args.out, data)
    emit(args, result, lambda r: kv(r, ["out", "task_id", "bytes", "model_hash", "receipt_checked"]))


def _export_from_node(args: argparse.Namespace) -> None:
    """export-model without --data-dir: the model file downloaded from the node's
    ``artifacts/v1/runs/T/model``, written only once its receipt verifies and its weights hash to
    the receipt's final model hash. Nothing the node says is trusted but what the receipt's
    checks establish; the file is read whole (at most 16 GiB, as from a data dir) to be hashed."""
    from tenzro_training.errors import ArtifactUnavailable, CheckpointError
    from tenzro_training.fragments import compute_model_hash
    from tenzro_training.global_model import compute_final_model_file_bytes, compute_initial_model
    from tenzro_training.node.checkpoint import parse_checkpoint_bytes

    client = RpcClient(args.rpc)
    receipt = check_receipt_of(client, args.task_id)
    expected = receipt.final_model_hash
    try:
        data = fetch_when_room(client, artifact_path(args.task_id, "model"), MAX_CHECKPOINT_FILE_BYTES)
    except ArtifactUnavailable as exc:
        raise CliError(f"cannot export {args.task_id}: {why_unavailable(exc, 'the final model file').reason}",
                       EXIT_RPC_ERROR) from None
    try:
        state = parse_checkpoint_bytes(data, "the node's model file")
    except CheckpointError as exc:
        raise CliError(f"the node's model file of {args.task_id} is not a readable model: {exc.reason}",
                       EXIT_RPC_ERROR) from None
    model_hash = compute_model_hash(state)
    if model_hash != expected:
        raise CliError(f"the node's model file of {args.task_id} hashes to 0x{model_hash.hex()}, its receipt's "
                       f"final model hash is 0x{expected.hex()}: not written", EXIT_RPC_ERROR)
    # The right weights are not yet the run's file: its header (dtypes, the metadata naming the
    # run that evaluate-model reads back) is the node's word. The sealed file is a function of
    # the weights and the receipt alone (global_model.compute_final_model_file_bytes), so rebuild
    # it and take the node's bytes only if they are exactly that.
    try:
        split = compute_initial_model(state, receipt.spec.architecture.fragment_count)
        canonical = compute_final_model_file_bytes(args.task_id, receipt.final_model_hash, receipt.run_root,
                                                   split.model, split.weights)
    except TenzroError as exc:
        raise CliError(f"the node's model file of {args.task_id} does not split into the spec's fragments: {exc}",
                       EXIT_RPC_ERROR) from None
    del state, split
    if canonical != data:
        raise CliError(f"the node's model file of {args.task_id} has the receipt's weights but is not the sealed "
                       "model's file (its header or metadata differ): not written", EXIT_RPC_ERROR)
    del canonical
    result = {"task_id": args.task_id, "out": str(args.out), "bytes": len(data), "model_hash": "0x" + model_hash.hex(),
              "receipt_checked": True}
    write_out(args.out, data)
    emit(args, result, lambda r: kv(r, ["out", "task_id", "bytes", "model_hash", "receipt_checked"]))


def _read_model_file(path: str) -> tuple[Any, str, dict[str, str]]:
    """A model file as fp32 tensors, the SHA-256 of its bytes and its safetensors metadata,
    parsed as the node parses an init checkpoint: safetensors only (nothing executed),
    fp32/fp16/bf16 tensors, finite values."""
    import hashlib

    from storage.files import NotReadable, read_regular_file
    from tenzro_training.errors import CheckpointError
    from tenzro_training.node.checkpoint import parse_checkpoint_bytes

    try:
        data = read_regular_file(path, MAX_CHECKPOINT_FILE_BYTES)
    except NotReadable as exc:
        raise CliError(f"cannot read model {path}: {exc.reason}") from None
    try:
        state = parse_checkpoint_bytes(data, path)
    except CheckpointError as exc:
        raise CliError(f"model {path}: {exc.reason}") from None
    # The library parsed the header already: its metadata (export-model's task id and model hash).
    header = json.loads(data[8 : 8 + int.from_bytes(data[:8], "little")])
    metadata = header.get("__metadata__") if isinstance(header, dict) else None
    return state, "0x" + hashlib.sha256(data).hexdigest(), metadata if isinstance(metadata, dict) else {}


def cmd_evaluate_model(args: argparse.Namespace) -> None:
    """What the sponsor's sealed model is worth: its validation loss on the spec's held-out
    windows next to the initial model's and simple forecasts' (trainer/evaluation.py)."""
    from tenzro_training.fragments import compute_model_hash
    from tenzro_training.node.checkpoint import load_init_checkpoint
    from tenzro_training.trainer.evaluation import evaluate_models, load_validation_set
    from tenzro_training.trainer.inner import resolve_device

    if not args.model and not args.with_init:
        raise CliError("nothing to evaluate: pass --model FILE (repeatable) and/or --with-init")
    spec = read_spec_file(args.spec)  # SpecError -> exit 2 with the field path
    device = resolve_device(args.device)
    validation = load_validation_set(spec)  # UnknownFamily, ModelConfigError, DatasetError -> exit 2
    models = []  # (name, file, fp32 state, sha256 of the file)
    if args.with_init:
        ref = spec.init_checkpoint()
        if ref is None:
            raise CliError("--with-init: the spec names no architecture.metadata.init_checkpoint")
        state = load_init_checkpoint(spec, max_bytes=MAX_CHECKPOINT_FILE_BYTES)  # CheckpointError -> exit 2
        models.append(("init_checkpoint", str(checkpoint_path(ref.uri)), state, ref.sha256))
    notes = []
    for path in args.model or ():
        state, sha256, metadata = _read_model_file(path)
        models.append((path, path, state, sha256))
        # export-model names the run and its final model hash: a model of another run fits the
        # spec's shapes too (one architecture, one corpus for every dev run), so say so.
        exported_from, claimed = metadata.get("tenzro.task_id"), metadata.get("tenzro.model_hash")
        if isinstance(exported_from, str) and exported_from != spec.task_id:
            notes.append(f"model {path} was exported from task {exported_from}, not the spec's {spec.task_id}")
        model_hash = "0x" + compute_model_hash(state).hex()
        if isinstance(claimed, str) and claimed.lower() != model_hash:
            notes.append(f"model {path} says its model hash is {claimed}; its weights hash to {model_hash}")
    evaluation = evaluate_models(validation, [(name, state) for name, _, state, _ in models], device=device)
    result = {"task_id": spec.task_id, "spec_hash": "0x" + spec.spec_hash().hex(), "dataset_ref": spec.dataset_ref,
              "dataset_hash": spec.dataset_hash, "device": str(device), "metric": "mean normalised MSE",
              **evaluation.to_dict()}
    for entry, (_, file, state, sha256) in zip(result["models"], models):
        entry.update(file=file, sha256=sha256, model_hash="0x" + compute_model_hash(state).hex())
    for line in notes:
        note(line)
    emit(args, result, _human_evaluation)


def _human_evaluation(r: dict[str, Any]) -> str:
    def loss(value: float | None) -> str:
        return "-" if value is None else f"{value:.4f}"

    rows = [(m["name"], loss(m["loss"]), f"model_hash {m['model_hash']}") for m in r["models"]]
    rows += [(f"baseline {b['name']}", loss(b["loss"]), f"({b['note']})" if b["note"] else "") for b in r["baselines"]]
    width = max(len(name) for name, _, _ in rows)
    return "\n".join([
        f"task_id   {r['task_id']}",
        f"dataset   {r['dataset_ref']} (hash checked)",
        f"windows   {r['windows']} held out, context {r['context_len']}, horizon {r['horizon']}",
        f"device    {r['device']}",
        "validation loss (mean normalised MSE; lower is better)",
        *(f"  {name:<{width}}  {value:>7}  {extra}".rstrip() for name, value, extra in rows),
    ])
