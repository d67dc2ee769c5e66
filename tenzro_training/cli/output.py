"""What a command prints (human text, or JSON with ``--json``) and the check that a signed
call's answer is about what was asked."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from typing import Any, Callable, Sequence

from tenzro_training.cli.exits import EXIT_RPC_ERROR, CliError
from tenzro_training.logformat import format_stderr_line
from tenzro_training.terminal import printable, printable_lines


def emit(args: argparse.Namespace, result: Any, human: Callable[[Any], str]) -> None:
    if args.json:
        print(json.dumps(result, indent=2, sort_keys=True))
    else:
        print(printable_lines(human(result)))


def note(text: str) -> None:
    """A ``tenzro: note: ...`` line on stderr (a JSON record under ``--log-format json``): something
    the user should know that does not stop the command."""
    print(format_stderr_line(f"tenzro: note: {printable(text)}", logging.WARNING), file=sys.stderr)


def kv(result: Any, keys: Sequence[str]) -> str:
    if not isinstance(result, dict):
        return str(result)
    width = max(len(k) for k in keys)
    return "\n".join(f"{k:<{width}}  {result[k]}" for k in keys if k in result)


_HEX_ANSWER_FIELDS = frozenset({"address", "spec_hash", "payload_hash"})
"""Answer fields compared case-insensitively (EIP-55 addresses, hex hashes). Task ids are not:
``0xAb`` and ``0xab`` are two tasks."""


def check_answer(result: dict[str, Any], method: str, **asked: Any) -> None:
    """A signed call's answer must be about what was asked: this task, this round, these bytes.

    Why: a script trusts exit 0. A node (or anything at ``--rpc``) answering a cancel with
    another task's status, or a submission with another payload hash, made the command report
    success for something that did not happen (CLI probe, 2026-11-26). _HEX_ANSWER_FIELDS compare
    case-insensitively; everything else by type and value (a round of 2.9 or "2" is not round 2)."""
    for key, want in asked.items():
        got = result.get(key)
        if key in _HEX_ANSWER_FIELDS:
            same = isinstance(got, str) and got.lower() == want.lower()
        else:
            same = type(got) is type(want) and got == want
        if not same:
            raise CliError(f"the node's {method} answer says {key} {printable(repr(got), 100)}, not {want!r}: "
                           "it did not do what was asked", EXIT_RPC_ERROR)


def human_run(run: dict[str, Any]) -> str:
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
