"""``tenzro train`` verbs that call a run's JSON-RPC methods: post-task, list-runs, get-run,
get-receipt, enroll-trainer, submit-gradient, finalize-round, cancel-task, address."""

from __future__ import annotations

import argparse
import base64
import json
from typing import Any

from tenzro_training import auth
from tenzro_training.addresses import parse_address
from tenzro_training.cli.client import RpcClient
from tenzro_training.cli.exits import EXIT_RPC_ERROR, CliError
from tenzro_training.cli.files import MAX_INPUT_FILE_BYTES, read_text, write_out
from tenzro_training.cli.keys import key_address, load_signing_key, sign, signing_client
from tenzro_training.cli.output import check_answer, emit, human_run, kv, note
from tenzro_training.cli.values import parse_amount
from tenzro_training.terminal import printable


def cmd_post_task(args: argparse.Namespace) -> None:
    from tenzro_training.compression import PayloadEncoding, describe_sparse_cost
    from tenzro_training.spec import TrainingTaskSpec

    spec = TrainingTaskSpec.from_json(read_text(args.spec, "spec"))  # SpecError -> exit 2 with the field path
    encoding = PayloadEncoding.from_spec(spec)  # the node refuses a bad one too; say it before signing
    weakness = spec.aggregation.describe_no_tolerance(spec.quorum)
    if weakness is not None:  # the sponsor's choice, and valid: said, not refused
        note(f"{weakness} (docs/aggregation.md \"What each rule tolerates\")")
    cost = describe_sparse_cost(encoding, spec.aggregation)
    if cost is not None:
        note(f"{cost} (docs/aggregation.md \"Sparse inputs\")")
    key = load_signing_key(args)
    sig = sign(auth.PostTask(task_id=spec.task_id, spec_hash=spec.spec_hash()), key, args.chain_id)
    result = signing_client(args, key).call(
        "tenzro_training_postTask", {"spec": spec.to_dict(), "signature": sig}
    )
    check_answer(result, "postTask", task_id=spec.task_id, spec_hash="0x" + spec.spec_hash().hex())
    emit(args, result, lambda r: kv(r, ["task_id", "spec_hash", "status"]))


def cmd_list_runs(args: argparse.Namespace) -> None:
    params: dict[str, Any] = {"offset": args.offset, "limit": args.limit}
    if args.status:
        params["status"] = args.status
    result = RpcClient(args.rpc).call("tenzro_training_listRuns", params)

    def human(r: dict[str, Any]) -> str:
        runs = r.get("runs", [])
        if not runs:
            return "no runs"
        return "\n".join(f"{x.get('task_id')}  {x.get('status')}  round {x.get('round')}" for x in runs)

    emit(args, result, human)


def cmd_get_run(args: argparse.Namespace) -> None:
    result = RpcClient(args.rpc).call("tenzro_training_getRun", {"task_id": args.task_id})
    emit(args, result, human_run)


def cmd_get_receipt(args: argparse.Namespace) -> None:
    result = RpcClient(args.rpc).call("tenzro_training_getReceipt", {"task_id": args.task_id})
    # Checked before --out is written: a bad answer must not replace a good receipt file.
    receipt_obj = result.get("receipt")
    if not isinstance(receipt_obj, dict):
        raise CliError("the node's getReceipt answer has no receipt object", EXIT_RPC_ERROR)
    check_answer(receipt_obj, "getReceipt", task_id=args.task_id)

    def human(r: dict[str, Any]) -> str:
        receipt = r["receipt"]
        lines = [
            f"task              {receipt.get('task_id')}",
            f"run root          {receipt.get('run_root')}",
            f"final model hash  {receipt.get('final_model_hash')}",
            f"rounds            {len(receipt.get('transcript', []))}",
        ]
        for t in receipt.get("trainers", []):
            lines.append(f"  {t.get('address')}  accepted {t.get('accepted_submissions')}")
        return "\n".join(lines)

    text = human(result)  # before --out: an answer this cannot read must not replace a good file
    if args.out:
        write_out(args.out, json.dumps(result, indent=2, sort_keys=True).encode())
    emit(args, result, lambda r: text)


def cmd_enroll(args: argparse.Namespace) -> None:
    key = load_signing_key(args)
    address = key_address(key)
    stake = parse_amount(args.stake, "--stake")
    msg = auth.EnrollTrainer(
        task_id=args.task_id, did=args.did, trainer=parse_address(address), stake=stake
    )
    result = signing_client(args, key).call(
        "tenzro_training_enrollTrainer",
        {
            "task_id": args.task_id,
            "did": args.did,
            "address": address,
            "stake": str(stake),
            "signature": sign(msg, key, args.chain_id),
        },
    )
    check_answer(result, "enrollTrainer", task_id=args.task_id, address=address)
    emit(args, result, lambda r: kv(r, ["task_id", "address", "shard", "status"]))


def cmd_submit_gradient(args: argparse.Namespace) -> None:
    from tenzro_training.payload import compute_payload_hash

    from storage.files import NotReadable, read_regular_file

    try:
        payload = read_regular_file(args.payload, MAX_INPUT_FILE_BYTES)
    except NotReadable as exc:
        raise CliError(f"cannot read payload {args.payload}: {exc.reason}") from None
    key = load_signing_key(args)
    payload_hash = compute_payload_hash(payload)
    msg = auth.SubmitOuterGradient(
        task_id=args.task_id, round=args.round, fragment=args.fragment, payload_hash=payload_hash
    )
    result = signing_client(args, key).call(
        "tenzro_training_submitOuterGradient",
        {
            "task_id": args.task_id,
            "round": args.round,
            "fragment": args.fragment,
            "payload": base64.b64encode(payload).decode(),
            "signature": sign(msg, key, args.chain_id),
        },
    )
    check_answer(result, "submitOuterGradient", task_id=args.task_id, round=args.round, fragment=args.fragment,
                  payload_hash="0x" + payload_hash.hex())
    emit(args, result, lambda r: kv(r, ["task_id", "round", "fragment", "payload_hash", "accepted_count", "quorum_reached", "status"]))


def cmd_finalize(args: argparse.Namespace) -> None:
    key = load_signing_key(args)
    client = signing_client(args, key)
    round_ = args.round
    if round_ is None:
        view = client.call("tenzro_training_getRun", {"task_id": args.task_id})
        check_answer(view, "getRun", task_id=args.task_id)
        round_ = view.get("round")
        if type(round_) is not int or not 0 <= round_ < 2**64:  # int() signed 2.9 as round 2
            raise CliError(f"the node's getRun answer has no round to finalize ({printable(repr(round_), 40)})",
                           EXIT_RPC_ERROR)
    msg = auth.FinalizeRound(task_id=args.task_id, round=round_)
    result = client.call(
        "tenzro_training_finalizeRound",
        {"task_id": args.task_id, "round": round_, "signature": sign(msg, key, args.chain_id)},
    )
    check_answer(result, "finalizeRound", task_id=args.task_id, round=round_)
    emit(args, result, lambda r: kv(r, ["task_id", "round", "model_hash", "syncer", "syncer_rank", "status", "run_root"]))


def cmd_cancel(args: argparse.Namespace) -> None:
    key = load_signing_key(args)
    msg = auth.CancelTask(task_id=args.task_id)
    result = signing_client(args, key).call(
        "tenzro_training_cancelTask",
        {"task_id": args.task_id, "signature": sign(msg, key, args.chain_id)},
    )
    check_answer(result, "cancelTask", task_id=args.task_id, status="Cancelled")
    emit(args, result, lambda r: kv(r, ["task_id", "status"]))


def cmd_address(args: argparse.Namespace) -> None:
    address = key_address(load_signing_key(args))
    emit(args, {"address": address}, lambda r: r["address"])
