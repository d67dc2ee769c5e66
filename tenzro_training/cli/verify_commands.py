"""``tenzro train verify-receipt`` (receipt_check.py) and ``verify-run`` (run_replay.py): a
third party's checks of a sealed run, from a file or a node's URL."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from tenzro_training.cli.artifacts import artifact_path, fetch_when_room, why_unavailable
from tenzro_training.cli.client import RpcClient
from tenzro_training.cli.exits import EXIT_RPC_ERROR, EXIT_UNREACHABLE, CliError
from tenzro_training.cli.files import MAX_CHECKPOINT_FILE_BYTES, read_checkpoint_file, read_text
from tenzro_training.terminal import printable


def cmd_verify_receipt(args: argparse.Namespace) -> None:
    """Offline verification (receipt_check.py): one line per check; exit 1 if any fails."""
    from tenzro_training.receipt_check import check_receipt_document

    if args.file is not None:
        from tenzro_training.jsontext import loads_bounded

        text = read_text(args.file, "receipt file")
        try:
            document = loads_bounded(text)
        except ValueError:
            document = None  # not JSON: reported as a failed "decode" check
    else:
        document = RpcClient(args.rpc).call("tenzro_training_getReceipt", {"task_id": args.task_id})
    # From the node: the receipt must be of the run asked for (a valid receipt of another run
    # passes every other check). From a file: the task_id line says which run it is.
    result = check_receipt_document(document, args.chain_id, task_id=args.task_id)
    skipped = ["abi"] if result.get("decode") is None and isinstance(document, dict) and document.get("abi") is None else []
    if args.json:
        checks = [{"name": c.name, "ok": c.ok, "detail": c.detail} for c in result.checks]
        print(json.dumps({"ok": result.ok, "checks": checks, "skipped": skipped}, indent=2, sort_keys=True))
    else:
        width = max(len(c.name) for c in result.checks)
        if args.task_id is None and result.get("decode") is None and isinstance(document, dict):
            named = document["receipt"].get("task_id")  # decoded: a receipt object with a task id
            print(f"task  {printable(str(named))} (named by the file)")
        for c in result.checks:
            print(f"{'ok  ' if c.ok else 'FAIL'}  {c.name:<{width}}  {printable(c.detail)}")
        for name in skipped:
            print(f"skip  {name:<{width}}  the document has no abi bytes (not compared with the receipt)")
    if not result.ok:
        failed = ", ".join(result.failed)
        raise CliError(f"receipt verification failed: {failed}", EXIT_RPC_ERROR)


def cmd_verify_run(args: argparse.Namespace) -> None:
    """Recompute a sealed run from the node's URL alone (run_replay.py): the receipt's checks,
    then the spec, checkpoint, every accepted payload, every round and the final model. One
    line per check; exit 1 if any fails or could not run."""
    from tenzro_training.addresses import Address
    from tenzro_training.errors import ArtifactUnavailable
    from tenzro_training.node.checkpoint import parse_checkpoint_bytes
    from concurrent.futures import ThreadPoolExecutor

    from tenzro_training.run_replay import RunSources, verify_run

    client = RpcClient(args.rpc, args.timeout)
    task_id = args.task_id
    max_checkpoint = args.max_checkpoint_bytes or MAX_CHECKPOINT_FILE_BYTES
    document = client.call("tenzro_training_getReceipt", {"task_id": task_id})

    def run_view() -> object:
        try:
            return client.call("tenzro_training_getRun", {"task_id": task_id})
        except CliError as exc:
            if exc.exit_code == EXIT_UNREACHABLE:
                raise
            raise ArtifactUnavailable(str(exc)) from None

    def checkpoint(max_bytes: int) -> bytes:
        if args.checkpoint is not None:
            return read_checkpoint_file(args.checkpoint, max_bytes)
        try:
            return fetch_when_room(client, artifact_path(task_id, "checkpoint"), max_bytes)
        except ArtifactUnavailable as exc:
            raise why_unavailable(exc, "the init checkpoint") from None

    def payload(round_: int, fragment: int, trainer: Address, max_bytes: int) -> bytes:
        try:
            return fetch_when_room(client, artifact_path(task_id, "payloads", round_, fragment, "0x" + trainer.hex()),
                                    max_bytes)
        except ArtifactUnavailable as exc:
            raise why_unavailable(exc, "the payload") from None

    def model_file(size: int) -> bytes:
        try:
            return fetch_when_room(client, artifact_path(task_id, "model"), size)
        except ArtifactUnavailable as exc:
            raise why_unavailable(exc, "the final model file") from None

    def progress(done: int, total: int) -> None:
        print(f"tenzro: verify-run: {done}/{total} rounds replayed", file=sys.stderr, flush=True)

    where = args.checkpoint or "the node's checkpoint"
    with ThreadPoolExecutor(max_workers=args.downloads, thread_name_prefix="tenzro-verify-run") as downloads:
        sources = RunSources(run_view, checkpoint, lambda data: parse_checkpoint_bytes(data, where), payload,
                             model_file, max_checkpoint, fetch_map=downloads.map)
        result = verify_run(document, sources, chain_id=args.chain_id, task_id=task_id,
                            on_round=progress if sys.stderr.isatty() else None)
    if args.json:
        checks = [{"name": c.name, "ok": c.ok, "detail": c.detail} for c in result.checks]
        print(json.dumps({"ok": result.ok, "checks": checks, "skipped": [c.name for c in result.skipped]},
                         indent=2, sort_keys=True))
    else:
        width = max(len(c.name) for c in (*result.checks, *result.skipped))
        for c in result.checks:
            print(f"{'ok  ' if c.ok else 'FAIL'}  {c.name:<{width}}  {printable(c.detail)}")
        for c in result.skipped:
            print(f"skip  {c.name:<{width}}  {printable(c.detail)}")
    if not result.ok:
        failed = ", ".join(result.failed)
        raise CliError(f"run verification failed: {failed}", EXIT_RPC_ERROR)


def check_receipt_of(client: RpcClient, task_id: str) -> Any:
    """``task_id``'s receipt (a TrainingReceipt) from ``client``'s node, after the whole offline
    check of it (signatures, election, run root), for this run: any object naming the right
    hash passed before (CLI probe, 2026-11-26)."""
    from tenzro_training.receipt import TrainingReceipt
    from tenzro_training.receipt_check import check_receipt_document

    reply = client.call("tenzro_training_getReceipt", {"task_id": task_id})
    verdict = check_receipt_document(reply, None, task_id=task_id)
    if not verdict.ok:
        raise CliError(f"the node's receipt of {task_id} fails verification "
                       f"({', '.join(verdict.failed)}: see verify-receipt)", EXIT_RPC_ERROR)
    return TrainingReceipt.from_dict(reply["receipt"])  # decoded by the check above
