"""The ``tenzro`` command line: a SHELL over the JSON-RPC API and the node service.

``tenzro node`` runs the node; ``tenzro train <verb>`` wraps the seven ``tenzro_training_*``
methods (plus cancel and a few offline helpers); ``tenzro syncer run`` is the syncer daemon.
Every signing command takes ``--key-file`` or ``TENZRO_PRIVATE_KEY``. Output is human-readable by
default and JSON with ``--json``; any failure prints one line to stderr and exits non-zero:
1 for an error the node answered, 2 for bad usage or local input, 3 when the node is unreachable.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import sys
from pathlib import Path
from typing import Any, Callable, Sequence

from tenzro_training import auth
from tenzro_training.addresses import parse_address
from tenzro_training.errors import TenzroError

DEFAULT_RPC = "http://127.0.0.1:8545"

EXIT_OK = 0
EXIT_RPC_ERROR = 1
EXIT_USAGE = 2
EXIT_UNREACHABLE = 3


class CliError(TenzroError):
    """A failure the CLI reports as one line and an exit status."""

    def __init__(self, message: str, exit_code: int = EXIT_USAGE) -> None:
        self.exit_code = exit_code
        super().__init__(message)


# --- JSON-RPC client --------------------------------------------------------------------------


class RpcClient:
    """Minimal synchronous JSON-RPC 2.0 client over HTTP (stdlib only)."""

    def __init__(self, url: str, timeout: float = 120.0) -> None:
        self.url = url
        self.timeout = timeout
        self._next_id = 1

    def call(self, method: str, params: dict[str, Any]) -> Any:
        import urllib.error
        import urllib.request

        body = json.dumps(
            {"jsonrpc": "2.0", "id": self._next_id, "method": method, "params": params}
        ).encode()
        self._next_id += 1
        req = urllib.request.Request(
            self.url, data=body, headers={"Content-Type": "application/json"}, method="POST"
        )
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as exc:  # JSON-RPC errors may come with 4xx statuses
            raw = exc.read()
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise CliError(f"cannot reach node at {self.url}: {reason}", EXIT_UNREACHABLE) from None
        try:
            reply = json.loads(raw)
        except ValueError:
            raise CliError(f"node at {self.url} did not answer JSON-RPC", EXIT_UNREACHABLE) from None
        if not isinstance(reply, dict):
            raise CliError("unexpected JSON-RPC reply shape", EXIT_RPC_ERROR)
        if "error" in reply:
            err = reply["error"] or {}
            data = err.get("data") or {}
            kind = data.get("type", "") if isinstance(data, dict) else ""
            label = f" {kind}" if kind else ""
            raise CliError(f"error {err.get('code')}{label}: {err.get('message')}", EXIT_RPC_ERROR)
        return reply.get("result")


# --- keys ---------------------------------------------------------------------------------------


def load_private_key(key_file: str | None) -> bytes:
    """A 32-byte secp256k1 key from --key-file (hex text or JSON {"private_key": ...}) or the env."""
    text: str | None
    if key_file:
        try:
            text = Path(key_file).read_text().strip()
        except OSError as exc:
            raise CliError(f"cannot read key file {key_file}: {exc.strerror}") from None
        if text.startswith("{"):
            try:
                text = str(json.loads(text)["private_key"])
            except (ValueError, KeyError, TypeError):
                raise CliError(f"key file {key_file}: expected JSON with a private_key field") from None
    else:
        text = os.environ.get("TENZRO_PRIVATE_KEY")
        if not text:
            raise CliError("no signing key: pass --key-file or set TENZRO_PRIVATE_KEY")
    hex_text = text[2:] if text.startswith(("0x", "0X")) else text
    try:
        key = bytes.fromhex(hex_text)
    except ValueError:
        key = b""
    if len(key) != 32:
        raise CliError("signing key must be 32 bytes of hex")
    return key


def key_address(key: bytes) -> str:
    from eth_account import Account

    return str(Account.from_key(key).address)


def _sign(msg: auth.SignedMessageType, key: bytes, chain_id: int) -> str:
    return "0x" + auth.sign_message(msg, key, chain_id).hex()


# --- output -------------------------------------------------------------------------------------


def _emit(args: argparse.Namespace, result: Any, human: Callable[[Any], str]) -> None:
    if args.json:
        print(json.dumps(result, indent=2, sort_keys=True))
    else:
        print(human(result))


def _kv(result: Any, keys: Sequence[str]) -> str:
    if not isinstance(result, dict):
        return str(result)
    width = max(len(k) for k in keys)
    return "\n".join(f"{k:<{width}}  {result[k]}" for k in keys if k in result)


def _human_run(run: dict[str, Any]) -> str:
    lines = [
        f"task      {run.get('task_id')}",
        f"status    {run.get('status')}   round {run.get('round')}",
        f"syncer    {run.get('syncer')} (rank {run.get('syncer_rank')})",
    ]
    trainers = run.get("trainers") or []
    lines.append(f"trainers  {len(trainers)}")
    for t in trainers:
        mark = "  SLASHED" if t.get("slashed") else ""
        lines.append(f"  shard {t.get('shard')}: {t.get('address')} stake {t.get('stake')}{mark}")
    counts = run.get("submission_counts")
    if counts is not None:
        lines.append(f"submissions per fragment  {counts}")
    records = run.get("round_records") or []
    lines.append(f"finalized rounds  {len(records)}")
    if run.get("run_root"):
        lines.append(f"run root  {run['run_root']}")
    return "\n".join(lines)


# --- commands -----------------------------------------------------------------------------------


def cmd_post_task(args: argparse.Namespace) -> None:
    from tenzro_training.spec import TrainingTaskSpec

    try:
        text = Path(args.spec).read_text()
    except OSError as exc:
        raise CliError(f"cannot read spec {args.spec}: {exc.strerror}") from None
    spec = TrainingTaskSpec.from_json(text)  # SpecError -> exit 2 with the field path
    key = load_private_key(args.key_file)
    sig = _sign(auth.PostTask(task_id=spec.task_id, spec_hash=spec.spec_hash()), key, args.chain_id)
    result = RpcClient(args.rpc).call(
        "tenzro_training_postTask", {"spec": spec.to_dict(), "signature": sig}
    )
    _emit(args, result, lambda r: _kv(r, ["task_id", "spec_hash", "status"]))


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

    _emit(args, result, human)


def cmd_get_run(args: argparse.Namespace) -> None:
    result = RpcClient(args.rpc).call("tenzro_training_getRun", {"task_id": args.task_id})
    _emit(args, result, _human_run)


def cmd_get_receipt(args: argparse.Namespace) -> None:
    result = RpcClient(args.rpc).call("tenzro_training_getReceipt", {"task_id": args.task_id})
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2, sort_keys=True))

    def human(r: dict[str, Any]) -> str:
        receipt = r.get("receipt", r)
        lines = [
            f"task              {receipt.get('task_id')}",
            f"run root          {receipt.get('run_root')}",
            f"final model hash  {receipt.get('final_model_hash')}",
            f"rounds            {len(receipt.get('transcript', []))}",
        ]
        for t in receipt.get("trainers", []):
            lines.append(f"  {t.get('address')}  accepted {t.get('accepted_submissions')}")
        return "\n".join(lines)

    _emit(args, result, human)


def cmd_enroll(args: argparse.Namespace) -> None:
    key = load_private_key(args.key_file)
    address = key_address(key)
    stake = _parse_amount(args.stake, "--stake")
    msg = auth.EnrollTrainer(
        task_id=args.task_id, did=args.did, trainer=parse_address(address), stake=stake
    )
    result = RpcClient(args.rpc).call(
        "tenzro_training_enrollTrainer",
        {
            "task_id": args.task_id,
            "did": args.did,
            "address": address,
            "stake": str(stake),
            "signature": _sign(msg, key, args.chain_id),
        },
    )
    _emit(args, result, lambda r: _kv(r, ["task_id", "address", "shard", "status"]))


def cmd_submit_gradient(args: argparse.Namespace) -> None:
    from tenzro_training.payload import compute_payload_hash

    try:
        payload = Path(args.payload).read_bytes()
    except OSError as exc:
        raise CliError(f"cannot read payload {args.payload}: {exc.strerror}") from None
    key = load_private_key(args.key_file)
    payload_hash = compute_payload_hash(payload)
    msg = auth.SubmitOuterGradient(
        task_id=args.task_id, round=args.round, fragment=args.fragment, payload_hash=payload_hash
    )
    result = RpcClient(args.rpc).call(
        "tenzro_training_submitOuterGradient",
        {
            "task_id": args.task_id,
            "round": args.round,
            "fragment": args.fragment,
            "payload": base64.b64encode(payload).decode(),
            "signature": _sign(msg, key, args.chain_id),
        },
    )
    _emit(args, result, lambda r: _kv(r, ["task_id", "round", "fragment", "payload_hash", "status"]))


def cmd_finalize(args: argparse.Namespace) -> None:
    client = RpcClient(args.rpc)
    round_ = args.round
    if round_ is None:
        round_ = int(client.call("tenzro_training_getRun", {"task_id": args.task_id})["round"])
    key = load_private_key(args.key_file)
    msg = auth.FinalizeRound(task_id=args.task_id, round=round_)
    result = client.call(
        "tenzro_training_finalizeRound",
        {"task_id": args.task_id, "round": round_, "signature": _sign(msg, key, args.chain_id)},
    )
    _emit(args, result, lambda r: _kv(r, ["task_id", "round", "model_hash", "status"]))


def cmd_cancel(args: argparse.Namespace) -> None:
    key = load_private_key(args.key_file)
    msg = auth.CancelTask(task_id=args.task_id)
    result = RpcClient(args.rpc).call(
        "tenzro_training_cancelTask",
        {"task_id": args.task_id, "signature": _sign(msg, key, args.chain_id)},
    )
    _emit(args, result, lambda r: _kv(r, ["task_id", "status"]))


def cmd_address(args: argparse.Namespace) -> None:
    address = key_address(load_private_key(args.key_file))
    _emit(args, {"address": address}, lambda r: r["address"])


def _parse_amount(text: str, flag: str) -> int:
    if not text.isdigit() or (len(text) > 1 and text[0] == "0"):
        raise CliError(f"{flag} must be a decimal integer (attoTNZO)")
    value = int(text)
    if value >= 2**256:
        raise CliError(f"{flag} exceeds uint256")
    return value


def cmd_node(args: argparse.Namespace) -> None:
    from tenzro_training.node.main import run_node_from_args

    run_node_from_args(args)


def cmd_syncer_run(args: argparse.Namespace) -> None:
    from tenzro_training.node.syncer import run_syncer_from_args

    run_syncer_from_args(args)


# --- parser ---------------------------------------------------------------------------------


def _client_flags(p: argparse.ArgumentParser, signing: bool) -> None:
    p.add_argument("--rpc", default=os.environ.get("TENZRO_RPC", DEFAULT_RPC), help="node JSON-RPC URL")
    p.add_argument("--json", action="store_true", help="print the raw JSON result")
    if signing:
        p.add_argument("--key-file", help="file holding the signer's private key (else TENZRO_PRIVATE_KEY)")
        p.add_argument("--chain-id", type=int, default=auth.DEFAULT_CHAIN_ID, help="EIP-712 chain id")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tenzro", description="Tenzro Train node and client")
    top = parser.add_subparsers(dest="command", required=True)

    node = top.add_parser("node", help="run the node (JSON-RPC service)")
    node.add_argument("--data-dir", required=True, help="directory for RocksDB, models and keys")
    node.add_argument("--rpc-host", default="127.0.0.1")
    node.add_argument("--rpc-port", type=int, default=8545)
    node.add_argument("--config", help="node config JSON file")
    node.add_argument("--dev", action="store_true", help="dev genesis: funded accounts in <data-dir>/dev-accounts.json")
    node.set_defaults(func=cmd_node)

    train = top.add_parser("train", help="sponsor, trainer and syncer calls").add_subparsers(
        dest="verb", required=True
    )
    p = train.add_parser("post-task", help="post a TrainingTaskSpec (signed by its sponsor)")
    p.add_argument("--spec", required=True)
    _client_flags(p, signing=True)
    p.set_defaults(func=cmd_post_task)

    p = train.add_parser("list-runs")
    p.add_argument("--status")
    p.add_argument("--offset", type=int, default=0)
    p.add_argument("--limit", type=int, default=50)
    _client_flags(p, signing=False)
    p.set_defaults(func=cmd_list_runs)

    for verb, func in (("get-run", cmd_get_run), ("get-receipt", cmd_get_receipt)):
        p = train.add_parser(verb)
        p.add_argument("--task-id", required=True)
        if verb == "get-receipt":
            p.add_argument("--out", help="also write the receipt JSON to this file")
        _client_flags(p, signing=False)
        p.set_defaults(func=func)

    p = train.add_parser("enroll-trainer")
    p.add_argument("--task-id", required=True)
    p.add_argument("--did", required=True)
    p.add_argument("--stake", required=True, help="attoTNZO")
    _client_flags(p, signing=True)
    p.set_defaults(func=cmd_enroll)

    p = train.add_parser("submit-gradient")
    p.add_argument("--task-id", required=True)
    p.add_argument("--round", type=int, required=True)
    p.add_argument("--fragment", type=int, required=True)
    p.add_argument("--payload", required=True, help="safetensors OuterGradient payload file")
    _client_flags(p, signing=True)
    p.set_defaults(func=cmd_submit_gradient)

    p = train.add_parser("finalize-round")
    p.add_argument("--task-id", required=True)
    p.add_argument("--round", type=int, help="defaults to the run's current round")
    _client_flags(p, signing=True)
    p.set_defaults(func=cmd_finalize)

    p = train.add_parser("cancel-task", help="sponsor cancels before training starts")
    p.add_argument("--task-id", required=True)
    _client_flags(p, signing=True)
    p.set_defaults(func=cmd_cancel)

    p = train.add_parser("address", help="print the address of the signing key")
    _client_flags(p, signing=True)
    p.set_defaults(func=cmd_address)

    syncer = top.add_parser("syncer", help="syncer daemon").add_subparsers(dest="verb", required=True)
    p = syncer.add_parser("run", help="finalize rounds as soon as quorum and the grace window allow")
    p.add_argument("--poll-interval", type=float, default=0.5)
    p.add_argument("--once", action="store_true", help="make one pass and exit (for scripts)")
    _client_flags(p, signing=True)
    p.set_defaults(func=cmd_syncer_run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        args.func(args)
    except CliError as exc:
        print(f"tenzro: {exc}", file=sys.stderr)
        return exc.exit_code
    except TenzroError as exc:  # local validation (spec, address, signing inputs)
        print(f"tenzro: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 130
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
