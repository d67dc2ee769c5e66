"""The argparse tree of ``tenzro``: every command, its flags and their value types (a bad value
is refused at parse time, exit 2, rather than when it is first used)."""

from __future__ import annotations

import argparse
import os

from tenzro_training import auth
from tenzro_training.cli import values
from tenzro_training.cli.client import DEFAULT_RPC
from tenzro_training.cli.model_commands import cmd_evaluate_model, cmd_export_model
from tenzro_training.cli.operator_commands import cmd_audit, cmd_keys_new_account, cmd_keys_new_vrf, cmd_node, cmd_syncer_run, cmd_trainer_run
from tenzro_training.cli.run_commands import cmd_address, cmd_cancel, cmd_enroll, cmd_finalize, cmd_get_receipt, cmd_get_run, cmd_list_runs, cmd_post_task, cmd_submit_gradient
from tenzro_training.cli.spec_commands import DEFAULT_DATASET_REF, EXAMPLE_SPECS, cmd_dataset_hash, cmd_example_spec, cmd_init_checkpoint, cmd_make_gradient
from tenzro_training.cli.verify_commands import cmd_verify_receipt, cmd_verify_run


def _client_flags(p: argparse.ArgumentParser, signing: bool, json_output: bool = True) -> None:
    """``--rpc``, ``--json`` (only for commands that print a result: not the long-running
    trainer and syncer processes, whose output is log lines) and the signing flags."""
    p.add_argument("--rpc", default=os.environ.get("TENZRO_RPC", DEFAULT_RPC),
                   help=f"node JSON-RPC URL (default: $TENZRO_RPC, else {DEFAULT_RPC})")
    if json_output:
        p.add_argument("--json", action="store_true", help="print the raw JSON result")
    if signing:
        p.add_argument("--key-file", type=values.file_path,
                       help="file holding the signer's private key (else TENZRO_PRIVATE_KEY)")
        p.add_argument("--account", help="with a dev-accounts.json key file: sponsor, trainer:N, syncer:N or an address")
        p.add_argument("--chain-id", type=values.chain_id, default=auth.DEFAULT_CHAIN_ID,
                       help=f"EIP-712 chain id (default {auth.DEFAULT_CHAIN_ID}, the dev chain's)")


def build_parser() -> argparse.ArgumentParser:
    from tenzro_training import __version__

    parser = argparse.ArgumentParser(prog="tenzro", description="Tenzro Train node and client")
    parser.add_argument("--version", action="version", version=f"tenzro {__version__}")
    top = parser.add_subparsers(dest="command", required=True)

    node = top.add_parser("node", help="run the node (JSON-RPC service)")
    node.add_argument("--data-dir", required=True, type=values.dir_path, help="directory for RocksDB, models and keys")
    node.add_argument("--rpc-host", help="JSON-RPC bind address (default: config rpc_host, 127.0.0.1)")
    node.add_argument("--rpc-port", type=int, help="JSON-RPC port, 0 = any free port (default: config rpc_port, 8545)")
    node.add_argument("--config", help="node config JSON file (docs/node.md)")
    node.add_argument("--dev", action="store_true", help="dev genesis: funded accounts in <data-dir>/dev-accounts.json")
    node.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    node.add_argument("--log-format", default="text", choices=["text", "json"],
                      help="stderr log lines: text, or one JSON object per line for a log collector (docs/cli.md)")
    node.add_argument("--p2p-listen", action="append", metavar="MULTIADDR",
                      help="turn on gossip: libp2p listen address, e.g. /ip4/127.0.0.1/tcp/0 (repeatable)")
    node.add_argument("--p2p-key", help="libp2p identity key file (default <data-dir>/p2p-key, created 0600)")
    node.add_argument("--bootstrap", action="append", metavar="MULTIADDR", help="peer to dial at start (repeatable)")
    node.set_defaults(func=cmd_node)

    audit = top.add_parser(
        "audit", help="recompute a node's runs from their checkpoints and stored payloads; compare with its records",
        description="Replays every committed round of each run from its initial checkpoint and the stored "
                    "payloads and checks the round records, reports, snapshots, final weights, run root and "
                    "receipt. Opens the store read-only: it can run beside the node. Exit status 1 when a "
                    "difference is found (docs/node.md \"Auditing a store\").",
    )
    audit.add_argument("--data-dir", required=True, type=values.dir_path, help="the node's data directory")
    audit.add_argument("--task-id", action="append", help="audit only this run (repeatable; default: every run)")
    audit.add_argument("--allow-checkpoint-dir", action="append", metavar="DIR",
                       help="read init checkpoints only under DIR (repeatable; default: wherever the spec points)")
    audit.add_argument("--max-checkpoint-bytes", type=values.checkpoint_bytes, metavar="N", help="largest init checkpoint read (default 16 GiB, the node's default; "
                                         "set it to the node's max_checkpoint_bytes when that is larger)")
    audit.add_argument("--json", action="store_true", help="print the result as JSON")
    audit.set_defaults(func=cmd_audit)

    train = top.add_parser("train", help="sponsor, trainer and syncer calls").add_subparsers(
        dest="verb", required=True
    )
    p = train.add_parser("example-spec", help="write a shipped example TrainingTaskSpec to edit or post")
    p.add_argument("--name", choices=sorted(EXAMPLE_SPECS), default="dev",
                   help="dev (default): posts as-is on a --dev node after init-checkpoint; "
                        "timesfm-200m: SPEC.md's example, a template")
    p.add_argument("--task-id", help="replace the example's task_id (a node takes each task_id once)")
    p.add_argument("--sponsor-address", help="replace the example's sponsor_address (the signing key's address)")
    p.add_argument("--out", required=True, type=values.file_path, help="the spec file to write")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(func=cmd_example_spec)

    p = train.add_parser("dataset-hash", help="the dataset_hash a spec needs for a statsmodels: dataset_ref")
    p.add_argument("--dataset-ref", default=DEFAULT_DATASET_REF,
                   help=f"statsmodels:NAME[,NAME...] (default {DEFAULT_DATASET_REF})")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(func=cmd_dataset_hash)

    p = train.add_parser("init-checkpoint",
                         help="write the initial model a spec's metadata describes, and its URI and SHA-256")
    p.add_argument("--spec", required=True, help="the TrainingTaskSpec (its init_checkpoint, if any, is ignored)")
    p.add_argument("--out", required=True, type=values.file_path, help="the safetensors file to write")
    p.add_argument("--seed", type=values.seed, default=0, help="weights seed: the same spec and seed give the same file (default 0)")
    p.add_argument("--spec-out", type=values.file_path, help="also write the spec with architecture.metadata.init_checkpoint set")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(func=cmd_init_checkpoint)

    p = train.add_parser("post-task", help="post a TrainingTaskSpec (signed by its sponsor)")
    p.add_argument("--spec", required=True)
    _client_flags(p, signing=True)
    p.set_defaults(func=cmd_post_task)

    p = train.add_parser("list-runs", help="list the node's runs (optionally of one status), a page at a time")
    p.add_argument("--status")
    p.add_argument("--offset", type=int, default=0)
    p.add_argument("--limit", type=int, default=50)
    _client_flags(p, signing=False)
    p.set_defaults(func=cmd_list_runs)

    for verb, func, text in (
        ("get-run", cmd_get_run, "show a run: status, round, trainers, syncer, deadlines, committed rounds"),
        ("get-receipt", cmd_get_receipt, "show a sealed run's TrainingReceipt"),
    ):
        p = train.add_parser(verb, help=text)
        p.add_argument("--task-id", required=True)
        if verb == "get-receipt":
            p.add_argument("--out", type=values.file_path,
                           help="also write the whole result (receipt, abi, attestations) to this file")
        _client_flags(p, signing=False)
        p.set_defaults(func=func)

    p = train.add_parser("verify-receipt", help="re-check a receipt, its election and its signatures offline")
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--task-id", help="fetch the receipt with getReceipt from --rpc")
    source.add_argument("--file", help="a file written by get-receipt --out")
    p.add_argument("--chain-id", type=values.chain_id, help="EIP-712 chain id to verify under (default: the attestations')")
    _client_flags(p, signing=False)
    p.set_defaults(func=cmd_verify_receipt)

    p = train.add_parser("verify-run", help="recompute a sealed run from the node's URL: receipt, checkpoint, "
                                            "every accepted payload, every round, the final model")
    p.add_argument("--task-id", required=True)
    p.add_argument("--checkpoint", type=values.file_path, metavar="FILE",
                   help="the init checkpoint, from a source of your own (default: downloaded from the node); "
                        "checked against the spec's SHA-256 either way")
    p.add_argument("--chain-id", type=values.chain_id, help="EIP-712 chain id to verify under (default: the attestations')")
    p.add_argument("--max-checkpoint-bytes", type=values.checkpoint_bytes, metavar="N",
                   help="largest init checkpoint read (default 16 GiB, the node's default)")
    p.add_argument("--timeout", type=values.seconds, default=120.0, metavar="SECONDS",
                   help="limit on each request to the node, a download included (default 120)")
    p.add_argument("--downloads", type=values.downloads, default=4, metavar="N",
                   help="payload downloads in flight at once, 1..32 (default 4)")
    _client_flags(p, signing=False)
    p.set_defaults(func=cmd_verify_run)

    p = train.add_parser("enroll-trainer", help="enroll the signer as a trainer, bonding --stake")
    p.add_argument("--task-id", required=True)
    p.add_argument("--did", required=True)
    p.add_argument("--stake", required=True, help="attoTNZO")
    _client_flags(p, signing=True)
    p.set_defaults(func=cmd_enroll)

    p = train.add_parser("submit-gradient", help="submit an outer-gradient payload file inline (signed by the trainer)")
    p.add_argument("--task-id", required=True)
    p.add_argument("--round", type=int, required=True)
    p.add_argument("--fragment", type=int, required=True)
    p.add_argument("--payload", required=True, help="safetensors OuterGradient payload file")
    _client_flags(p, signing=True)
    p.set_defaults(func=cmd_submit_gradient)

    p = train.add_parser("finalize-round", help="finalize the run's current round (signed by its syncer)")
    p.add_argument("--task-id", required=True)
    p.add_argument("--round", type=int, help="defaults to the run's current round")
    _client_flags(p, signing=True)
    p.set_defaults(func=cmd_finalize)

    p = train.add_parser("cancel-task", help="sponsor cancels before training starts")
    p.add_argument("--task-id", required=True)
    _client_flags(p, signing=True)
    p.set_defaults(func=cmd_cancel)

    p = train.add_parser("make-gradient", help="write a random OuterGradient payload file (tests, demos)")
    p.add_argument("--task-id", help="the run (default: the spec's task_id); alone, layouts come from the node")
    p.add_argument("--round", type=int, required=True)
    p.add_argument("--fragment", type=int, required=True)
    p.add_argument("--spec", help="the task's spec file (else read from the node)")
    p.add_argument("--checkpoint", help="model checkpoint giving the layout (default: the spec's init_checkpoint)")
    p.add_argument("--random-seed", type=int, default=0, help="same seed, task, round, fragment -> same payload")
    p.add_argument("--scale", type=float, default=1e-3, help="standard deviation of the values")
    p.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"])
    p.add_argument("--out", required=True, type=values.file_path, help="payload file to write")
    _client_flags(p, signing=False)
    p.set_defaults(func=cmd_make_gradient)

    p = train.add_parser("export-model", help="write the sealed final model of a run (safetensors)")
    p.add_argument("--task-id", required=True)
    p.add_argument("--data-dir", type=values.dir_path,
                   help="the node's data directory (default: download the model from --rpc, checked against "
                        "the verified receipt)")
    p.add_argument("--out", required=True, type=values.file_path)
    p.add_argument("--check-receipt", action="store_true",
                   help="compare its hash with the node's verified receipt (always done without --data-dir)")
    _client_flags(p, signing=False)
    p.set_defaults(func=cmd_export_model)

    p = train.add_parser("evaluate-model",
                         help="score model files on the spec's held-out windows, beside simple forecasts")
    p.add_argument("--spec", required=True, help="the run's TrainingTaskSpec (its dataset and architecture)")
    p.add_argument("--model", action="append", type=values.file_path, metavar="FILE",
                   help="a safetensors model: export-model's or init-checkpoint's output (repeatable)")
    p.add_argument("--with-init", action="store_true",
                   help="also score the init checkpoint the spec names (checked against its SHA-256)")
    p.add_argument("--device", default="cpu", help="cpu (the default), auto, cuda, cuda:N or mps")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(func=cmd_evaluate_model)

    p = train.add_parser("address", help="print the address of the signing key")
    _client_flags(p, signing=True)
    p.set_defaults(func=cmd_address)

    trainer = top.add_parser("trainer", help="trainer process").add_subparsers(dest="verb", required=True)
    p = trainer.add_parser("run", help="enroll, then train and submit every round over gossip until Sealed")
    p.add_argument("--task-id", required=True)
    p.add_argument("--spec", help="the task's spec JSON (default: the one the node serves); checked against the "
                                  "run's spec hash either way")
    p.add_argument("--p2p-key", required=True, help="libp2p identity key file (created 0600 if missing)")
    p.add_argument("--bootstrap", action="append", required=True, metavar="MULTIADDR", help="the node's p2p address (repeatable; weights are taken only from the peers these name)")
    p.add_argument("--p2p-listen", action="append", metavar="MULTIADDR", help="default /ip4/127.0.0.1/tcp/0")
    p.add_argument("--rounds", type=int, help="stop after training this many rounds")
    p.add_argument("--did", help="default did:tenzro:trainer:<address>")
    p.add_argument("--stake", default=str(10**18), help="attoTNZO (default 1e18)")
    p.add_argument("--device", default="auto",
                   help="inner-loop device: auto (CUDA, else MPS, else CPU; the default), cpu, cuda, cuda:N, mps")
    p.add_argument("--batch-size", type=int, default=16, metavar="N",
                   help="windows per inner step (default 16; the trainer's own choice, not the protocol's: a GPU "
                        "trains more windows per second at a larger batch)")
    p.add_argument("--carry-optimizer-state", action="store_true",
                   help="keep the inner AdamW moments from round to round, as DiLoCo's workers do (default: a "
                        "fresh AdamW state every round)")
    p.add_argument("--max-round-wait", type=float, default=6 * 3600.0, metavar="SECONDS",
                   help="safety net: give up on a round not finalized, or on a run not training after enrolling, "
                        "after this long (default 21600); the wait normally ends with the round or at the "
                        "deadline the node reports")
    p.add_argument("--state-dir", help="where payloads are kept until their round is finalized (a restart "
                                       "resubmits the same bytes) and the record of every payload signed "
                                       "(slashing protection: never delete it) (default <dir of "
                                       "--p2p-key>/tenzro-trainer-state)")
    _client_flags(p, signing=True, json_output=False)
    p.set_defaults(func=cmd_trainer_run)

    keys = top.add_parser("keys", help="create account keys and syncer VRF secrets").add_subparsers(
        dest="verb", required=True
    )
    p = keys.add_parser("new-account", help="a new secp256k1 account key file (mode 600, never overwritten)")
    p.add_argument("--out", required=True, type=values.file_path, help="the key file to create")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(func=cmd_keys_new_account)
    p = keys.add_parser("new-vrf", help="a new ECVRF secret for a syncer candidate, and its config entries")
    p.add_argument("--address", required=True, help="the candidate's account address")
    p.add_argument("--stake", required=True, help="the candidate's registered stake (attoTNZO)")
    p.add_argument("--out", required=True, type=values.file_path, help="the secret file to create (mode 600, never overwritten)")
    p.add_argument("--json", action="store_true", help="print the config entries as JSON")
    p.set_defaults(func=cmd_keys_new_vrf)

    syncer = top.add_parser("syncer", help="syncer daemon").add_subparsers(dest="verb", required=True)
    p = syncer.add_parser("run", help="finalize rounds as soon as quorum and the grace window allow")
    p.add_argument("--poll-interval", type=float, default=0.5, metavar="SECONDS",
                   help="seconds between passes (default 0.5)")
    p.add_argument("--once", action="store_true", help="make one pass and exit (for scripts)")
    _client_flags(p, signing=True, json_output=False)
    p.set_defaults(func=cmd_syncer_run)
    _mark_command_parsers(parser)
    return parser


def _mark_command_parsers(parser: argparse.ArgumentParser) -> None:
    """Give every (sub)command's namespace the parser that owns it (``command_parser``), so an
    unknown flag is reported with that command's usage line: argparse reports leftovers from
    the top parser, and `tenzro node --confg x` showed `tenzro [-h] {node,...}`."""
    for action in parser._actions:  # argparse has no public walk over its subcommands
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                sub.set_defaults(command_parser=sub)
                _mark_command_parsers(sub)
