"""An operator's commands: keys, audit, and the long-running node, trainer and syncer
processes (each in its own module; these only hand them their arguments)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from tenzro_training.cli.exits import EXIT_RPC_ERROR, CliError
from tenzro_training.cli.output import emit
from tenzro_training.cli.values import parse_amount


def cmd_keys_new_account(args: argparse.Namespace) -> None:
    from tenzro_training.keyfiles import create_private_file, new_account_document

    doc = new_account_document()
    create_private_file(args.out, json.dumps(doc, indent=2) + "\n")
    emit(args, {"address": doc["address"], "key_file": str(args.out)},
          lambda r: f"{r['address']}\nkey written to {r['key_file']} (mode 600); use it with --key-file")


def cmd_keys_new_vrf(args: argparse.Namespace) -> None:
    from tenzro_training.keyfiles import create_private_file, new_vrf_document

    stake = parse_amount(args.stake, "--stake")
    doc = new_vrf_document(args.address)
    out = Path(args.out).absolute()
    create_private_file(out, json.dumps(doc, indent=2) + "\n")
    result = {
        "candidate": {"address": doc["address"], "vrf_public_key": doc["vrf_public_key"], "stake": str(stake)},
        "syncer_identity": {"address": doc["address"], "vrf_secret_file": str(out)},
    }

    def human(r: dict[str, Any]) -> str:
        return (f"VRF secret for {doc['address']} written to {out} (mode 600)\n"
                "every node's config registers the candidate under \"candidates\":\n"
                f"  {json.dumps(r['candidate'])}\n"
                "the node that tickets for it lists it under \"syncer_identities\":\n"
                f"  {json.dumps(r['syncer_identity'])}")

    emit(args, result, human)


def cmd_audit(args: argparse.Namespace) -> None:
    from storage import open_store
    from storage.interface import StorageError
    from tenzro_training.node.audit import audit_store

    db = Path(args.data_dir) / "db"
    if not db.is_dir():
        raise CliError(f"{args.data_dir} is not a node data directory (no db/)")
    try:
        store = open_store(db, create=False, read_only=True)
    except StorageError as exc:
        raise CliError(str(exc)) from None
    try:
        audits = audit_store(store, args.task_id or None,
                             allowed_dirs=tuple(Path(d).resolve() for d in args.allow_checkpoint_dir or ()),
                             **({} if args.max_checkpoint_bytes is None else {"max_checkpoint_bytes": args.max_checkpoint_bytes}))
    finally:
        store.close()
    result = {"ok": all(a.ok for a in audits), "runs": [a.to_dict() for a in audits]}

    def human(r: dict[str, Any]) -> str:
        lines = []
        for a in r["runs"]:
            head = f"{a['task_id']}: {a['status']}, {a['rounds_replayed']}/{a['rounds_committed']} rounds reproduced"
            if a["ok"]:
                lines.append(f"{head}; equal: {', '.join(a['checks'])}")
            else:
                lines.append(f"{head}; PROBLEM: {a['problem']}")
        return "\n".join(lines) if lines else "no runs in the store"

    emit(args, result, human)
    if not result["ok"]:
        failed = [a["task_id"] for a in result["runs"] if not a["ok"]]
        raise CliError(f"audit found problems in {len(failed)} run(s): {', '.join(failed)}", EXIT_RPC_ERROR)


def cmd_node(args: argparse.Namespace) -> None:
    from tenzro_training.node.main import run_node_from_args

    run_node_from_args(args)


def cmd_trainer_run(args: argparse.Namespace) -> None:
    from tenzro_training.trainer.process import run_trainer_from_args

    run_trainer_from_args(args)


def cmd_syncer_run(args: argparse.Namespace) -> None:
    from tenzro_training.node.syncer import run_syncer_from_args

    run_syncer_from_args(args)
