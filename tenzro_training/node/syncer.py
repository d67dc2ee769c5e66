"""The syncer daemon: ``tenzro syncer run --key-file K [--rpc URL] [--poll-interval S] [--once]``.

What this module is: a JSON-RPC client loop for one syncer key. Every poll it lists the node's
Training runs, reads each, and for every run whose current syncer is this key's address and whose
current round's accepted set is closed, signs ``FinalizeRound(task_id, round)`` (EIP-712) and sends
``tenzro_training_finalizeRound``. It logs one line per action, keeps going through node restarts
(connection errors are retried at the next poll) and exits 0 on Ctrl-C or SIGTERM.

What it is NOT: the aggregation (the node aggregates and steps the model when the syncer's signed
call arrives) or the election (the node ranks candidates; failover to this key happens on the
node, and the daemon simply notices that it has become the current syncer).

"Accepted set closed" comes from ``getRun``: the ``accepted_set_closed`` field when the node
serves it, else the same rule computed from the view (``run.is_accepted_set_closed``): quorum
reached and either ``now_ms`` past the straggler deadline or every unslashed trainer has
submitted every fragment.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Final

from tenzro_training import auth

__all__ = ["SyncerDaemon", "is_round_closed", "run_syncer_from_args"]

log = logging.getLogger("tenzro.syncer")

_PAGE: Final = 500


def is_round_closed(view: dict[str, Any]) -> bool:
    """Whether a getRun view says the current round may be finalized now (see module docstring)."""
    if view.get("status") != "Training":
        return False
    if "accepted_set_closed" in view:
        return bool(view["accepted_set_closed"])
    straggler = view.get("straggler_deadline_ms")
    if view.get("quorum_at_ms") is None or straggler is None:
        return False
    now = view.get("now_ms")
    if isinstance(now, int) and now > straggler:
        return True
    active = sum(1 for t in view.get("trainers") or [] if not t.get("slashed"))
    counts = view.get("submission_counts") or []
    return bool(counts) and all(isinstance(c, int) and c >= active for c in counts)


@dataclass
class SyncerDaemon:
    """Finalizes the rounds of every run where ``private_key``'s address is the current syncer."""

    client: Any
    """A ``cli.RpcClient`` (``call(method, params)``; CliError on failures)."""
    private_key: bytes
    chain_id: int = auth.DEFAULT_CHAIN_ID
    emit: Callable[[str], None] = print
    address: str = field(init=False)
    _attempted: dict[tuple[str, int], str] = field(default_factory=dict, init=False)
    _unreachable: bool = field(default=False, init=False)

    def __post_init__(self) -> None:
        from eth_account import Account

        self.address = str(Account.from_key(self.private_key).address)

    def _training_runs(self) -> Iterator[str]:
        from tenzro_training.cli import EXIT_RPC_ERROR, CliError

        offset = 0
        while True:
            page = self.client.call(
                "tenzro_training_listRuns", {"status": "Training", "offset": offset, "limit": _PAGE}
            )
            runs = page.get("runs", []) if isinstance(page, dict) else []
            if not isinstance(runs, list) or not all(
                isinstance(run, dict) and isinstance(run.get("task_id"), str) for run in runs
            ):
                raise CliError("the node's listRuns answer is malformed", EXIT_RPC_ERROR)
            for run in runs:
                yield run["task_id"]
            if len(runs) < _PAGE:
                return
            offset += len(runs)

    def poll_once(self) -> int:
        """One pass over the node's runs; returns how many rounds this pass finalized.

        Raises the client's CliError when the node is unreachable (the loop retries)."""
        from tenzro_training.cli import EXIT_UNREACHABLE, CliError

        done = 0
        for task_id in list(self._training_runs()):
            try:
                view = self.client.call("tenzro_training_getRun", {"task_id": task_id})
            except CliError as exc:
                if exc.exit_code == EXIT_UNREACHABLE:
                    raise
                continue  # the run vanished or the node refused: look again next poll
            if not isinstance(view, dict) or str(view.get("syncer") or "").lower() != self.address.lower():
                continue
            round_ = view.get("round")
            if type(round_) is not int or round_ < 0:
                self.emit(f"getRun {task_id}: the node's answer has no valid round; skipped")
                continue
            try:
                closed = is_round_closed(view)
            except (TypeError, ValueError, AttributeError) as exc:  # a field of the wrong type
                self.emit(f"getRun {task_id}: cannot read the node's answer ({exc}); skipped")
                continue
            if not closed:
                continue
            if self._finalize(task_id, round_):
                done += 1
        return done

    def _finalize(self, task_id: str, round_: int) -> bool:
        from tenzro_training.cli import EXIT_UNREACHABLE, CliError

        sig = auth.sign_message(auth.FinalizeRound(task_id=task_id, round=round_), self.private_key, self.chain_id)
        try:
            result = self.client.call(
                "tenzro_training_finalizeRound",
                {"task_id": task_id, "round": round_, "signature": "0x" + sig.hex()},
            )
        except CliError as exc:
            if exc.exit_code == EXIT_UNREACHABLE:
                raise
            # Log a refusal once per round (a race with the straggler window repeats each poll).
            message = str(exc)
            if self._attempted.get((task_id, round_)) != message:
                self._attempted[(task_id, round_)] = message
                self.emit(f"finalize {task_id} round {round_} refused: {message}")
            return False
        status = result.get("status") if isinstance(result, dict) else None
        model_hash = result.get("model_hash") if isinstance(result, dict) else None
        self.emit(f"finalized {task_id} round {round_} status {status} model {model_hash}")
        return True

    def run(self, poll_interval: float, once: bool, stop: threading.Event) -> None:
        """Poll until ``stop`` is set (or one pass with ``once``)."""
        from tenzro_training.cli import EXIT_UNREACHABLE, CliError

        self.emit(f"syncer {self.address} polling {self.client.url} every {poll_interval:g}s")
        while not stop.is_set():
            try:
                self.poll_once()
                if self._unreachable:
                    self.emit(f"node {self.client.url} reachable again")
                    self._unreachable = False
            except CliError as exc:
                if once:  # one pass: the error is the command's, nothing is retried
                    raise
                if exc.exit_code != EXIT_UNREACHABLE:
                    self.emit(f"poll failed: {exc}")
                elif not self._unreachable:
                    self._unreachable = True
                    self.emit(f"{exc}; retrying every {poll_interval:g}s")
            if once:
                return
            stop.wait(poll_interval)


def run_syncer_from_args(args: argparse.Namespace) -> None:
    """``tenzro syncer run``: returns (exit 0) on Ctrl-C/SIGTERM or after ``--once``."""
    from tenzro_training.cli import CliError, signing_client, load_signing_key

    # NaN too: it would poll with no pause at all; above TIMEOUT_MAX (~292 years) Event.wait overflows.
    if not 0 < args.poll_interval <= threading.TIMEOUT_MAX:
        raise CliError("--poll-interval must be a positive number of seconds")
    key = load_signing_key(args)
    stop = threading.Event()

    def _stop(_signum: int, _frame: Any) -> None:
        stop.set()

    previous = {sig: signal.signal(sig, _stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        daemon = SyncerDaemon(
            signing_client(args, key, timeout=60.0),
            key,
            args.chain_id,
            emit=lambda line: print(f"{time.strftime('%H:%M:%S')} {line}", flush=True),
        )
        daemon.run(args.poll_interval, args.once, stop)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if not args.once:
        print("syncer stopped", file=sys.stderr, flush=True)
