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
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final

from tenzro_training import auth
from tenzro_training.errors import TenzroError
from tenzro_training.records import is_valid_task_id
from tenzro_training.terminal import printable

__all__ = ["SyncerDaemon", "is_round_closed", "run_syncer_from_args"]

log = logging.getLogger("tenzro.syncer")

_PAGE: Final = 500
_MAX_RUNS: Final = 100_000
"""Most Training runs one pass reads. Why a bound: the ``--rpc`` endpoint is not trusted, and one
that answered every listRuns with a full page (a proxy dropping ``offset``) kept the first pass
paging forever: 10 GB after 9 minutes, deaf to SIGTERM (syncer probe)."""
_U64: Final = 2**64


class SyncerStopped(BaseException):
    """Raised by the SIGINT/SIGTERM handler inside a call in progress, so a hung call (up to the
    client's 60 s timeout) does not delay the exit (a supervisor's grace period is often 10 s).
    A finalize cut off this way is safe: the node commits it whole or not at all, and a repeat
    is a no-op."""


def is_round_closed(view: dict[str, Any]) -> bool:
    """Whether a getRun view says the current round may be finalized now (see module docstring)."""
    if view.get("status") != "Training":
        return False
    if "accepted_set_closed" in view:
        return view["accepted_set_closed"] is True  # "false" (a string) is not closed
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
    refused: int = field(default=0, init=False)
    """Finalize calls the node refused (``--once`` exits 1 when any was)."""
    _noted: dict[tuple[str, ...], str] = field(default_factory=dict, init=False)
    _ranking_checked: set[str] = field(default_factory=set, init=False)
    """Runs whose ranking this daemon has seen (once is enough: it never changes)."""
    _unreachable: bool = field(default=False, init=False)

    def __post_init__(self) -> None:
        from eth_account import Account

        self.address = str(Account.from_key(self.private_key).address)
        emit = self.emit
        # Lines carry the node's text (task ids, statuses, refusals): a hostile node's escape
        # sequences are escaped, and a lone surrogate can no longer end the daemon in print().
        self.emit = lambda line: emit(printable(line))

    def _note(self, key: tuple[str, ...], line: str) -> None:
        """Emit ``line`` unless the same line was emitted for ``key`` last time (per run or per
        round: a condition that lasts is said once, not every poll)."""
        if self._noted.get(key) != line:
            if len(self._noted) > 4096:
                self._noted.clear()
            self._noted[key] = line
            self.emit(line)

    def _training_runs(self, stop: threading.Event | None = None) -> list[tuple[str, str | None]]:
        """``(task_id, syncer or None when not listed)`` of every Training run, page by page."""
        from tenzro_training.cli.exits import EXIT_RPC_ERROR, CliError

        found: dict[str, str | None] = {}
        offset = 0
        while stop is None or not stop.is_set():
            page = self.client.call(
                "tenzro_training_listRuns", {"status": "Training", "offset": offset, "limit": _PAGE}
            )
            self._reached()
            runs = page.get("runs", []) if isinstance(page, dict) else []
            if not isinstance(runs, list) or not all(
                isinstance(run, dict) and isinstance(run.get("task_id"), str) for run in runs
            ):
                raise CliError("the node's listRuns answer is malformed", EXIT_RPC_ERROR)
            before = len(found)
            for run in runs:
                task_id, syncer = run["task_id"], run.get("syncer")
                if not is_valid_task_id(task_id):  # the node never makes one: skip, never crash on it
                    self._note(("task-id", ascii(task_id)[:200]), f"listRuns named a malformed task id "
                                                                   f"{ascii(task_id)[:80]}; skipped")
                    continue
                found[task_id] = syncer if isinstance(syncer, str) else None
            if len(runs) < _PAGE:
                break
            if len(found) == before or len(found) >= _MAX_RUNS:
                self._note(("paging",), f"listRuns paging stopped making progress at offset {offset + len(runs)} "
                                        f"({len(found)} runs read); using those")
                break
            offset += len(runs)
        return list(found.items())

    def _reached(self) -> None:
        if self._unreachable:
            self.emit(f"node {self.client.url} reachable again")
            self._unreachable = False

    def poll_once(self, stop: threading.Event | None = None) -> int:
        """One pass over the node's runs; returns how many rounds this pass finalized.

        Raises the client's CliError when the node is unreachable (the loop retries)."""
        from tenzro_training.cli.exits import EXIT_UNREACHABLE, CliError

        done = 0
        for task_id, listed_syncer in self._training_runs(stop):
            if stop is not None and stop.is_set():
                break
            if listed_syncer is not None and listed_syncer.lower() != self.address.lower() \
                    and task_id in self._ranking_checked:
                continue  # listRuns names another syncer: no getRun needed (its ranking was seen)
            try:
                view = self.client.call("tenzro_training_getRun", {"task_id": task_id})
            except CliError as exc:
                if exc.exit_code == EXIT_UNREACHABLE:
                    raise
                self._note(("getRun", task_id), f"getRun {task_id} refused: {exc}; skipped")
                continue  # the run vanished or the node refused: look again next poll
            if not isinstance(view, dict):
                self._note(("getRun", task_id), f"getRun {task_id}: the node's answer is not an object; skipped")
                continue
            self._check_ranked(task_id, view)
            if len(self._ranking_checked) > 100_000:
                self._ranking_checked.clear()
            self._ranking_checked.add(task_id)
            if str(view.get("syncer") or "").lower() != self.address.lower():
                continue
            round_ = view.get("round")
            if type(round_) is not int or not 0 <= round_ < _U64:
                self._note(("getRun", task_id), f"getRun {task_id}: the node's answer has no valid round; skipped")
                continue
            try:
                closed = is_round_closed(view)
            except (TypeError, ValueError, AttributeError) as exc:  # a field of the wrong type
                self._note(("getRun", task_id), f"getRun {task_id}: cannot read the node's answer ({exc}); skipped")
                continue
            if not closed:
                continue
            if self._finalize(task_id, round_):
                done += 1
        return done

    def _check_ranked(self, task_id: str, view: dict[str, Any]) -> None:
        """Say once per run when this key is not among its ranked candidates: a key that can
        never be the syncer (a trainer's, a typo) otherwise polled silently forever."""
        election = view.get("election")
        ranking = election.get("ranking") if isinstance(election, dict) else None
        if not isinstance(ranking, list):
            return
        ranked = {str(r.get("address") or "").lower() for r in ranking if isinstance(r, dict)}
        if self.address.lower() not in ranked:
            self._note(("ranked", task_id), f"{self.address} is not a ranked syncer candidate of {task_id}; "
                                            "this daemon will never finalize it")

    def _finalize(self, task_id: str, round_: int) -> bool:
        from tenzro_training.cli.exits import EXIT_UNREACHABLE, CliError

        try:
            sig = auth.sign_message(auth.FinalizeRound(task_id=task_id, round=round_), self.private_key, self.chain_id)
        except TenzroError as exc:  # fields the node should never have served
            self._note(("finalize", task_id, str(round_)), f"finalize {task_id} round {round_}: cannot sign it "
                                                           f"({exc}); skipped")
            return False
        try:
            result = self.client.call(
                "tenzro_training_finalizeRound",
                {"task_id": task_id, "round": round_, "signature": "0x" + sig.hex()},
            )
        except CliError as exc:
            if exc.exit_code == EXIT_UNREACHABLE:
                raise
            # Log a refusal once per round (a race with the straggler window repeats each poll).
            self.refused += 1
            self._note(("finalize", task_id, str(round_)), f"finalize {task_id} round {round_} refused: {exc}")
            return False
        status = result.get("status") if isinstance(result, dict) else None
        model_hash = result.get("model_hash") if isinstance(result, dict) else None
        self.emit(f"finalized {task_id} round {round_} status {status} model {model_hash}")
        return True

    def run(self, poll_interval: float, once: bool, stop: threading.Event) -> None:
        """Poll until ``stop`` is set (or one pass with ``once``: CliError when the node is
        unreachable or refused a finalize, so a cron job can tell)."""
        from tenzro_training.cli.exits import EXIT_RPC_ERROR, EXIT_UNREACHABLE, CliError

        if once:
            self.emit(f"syncer {self.address}: one pass over {self.client.url}")
            self.poll_once(stop)
            if self.refused:
                raise CliError(f"{self.refused} finalize call(s) refused (logged above)", EXIT_RPC_ERROR)
            return
        self.emit(f"syncer {self.address} polling {self.client.url} every {poll_interval:g}s")
        failing: str | None = None
        while not stop.is_set():
            try:
                self.poll_once(stop)
                if failing is not None:
                    self.emit("polls succeed again")
                    failing = None
            except CliError as exc:
                if exc.exit_code != EXIT_UNREACHABLE:
                    if str(exc) != failing:  # once per distinct failure, not every poll
                        failing = str(exc)
                        self.emit(f"poll failed: {exc}; retrying every {poll_interval:g}s")
                elif not self._unreachable:
                    self._unreachable = True
                    self.emit(f"{exc}; retrying every {poll_interval:g}s")
            stop.wait(poll_interval)


def run_syncer_from_args(args: argparse.Namespace) -> None:
    """``tenzro syncer run``: returns (exit 0) on Ctrl-C/SIGTERM or after ``--once``."""
    from tenzro_training.cli.exits import CliError
    from tenzro_training.cli.keys import load_signing_key, signing_client

    # NaN too: it would poll with no pause at all; above TIMEOUT_MAX (~292 years) Event.wait overflows.
    if not 0 < args.poll_interval <= threading.TIMEOUT_MAX:
        raise CliError("--poll-interval must be a positive number of seconds")
    key = load_signing_key(args)
    stop = threading.Event()
    armed = False  # raise out of the daemon only, never out of this function's own steps

    def _stop(_signum: int, _frame: Any) -> None:
        stop.set()
        if armed:
            raise SyncerStopped  # out of a call in progress too (see SyncerStopped)

    previous = {sig: signal.signal(sig, _stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        daemon = SyncerDaemon(
            signing_client(args, key, timeout=60.0),
            key,
            args.chain_id,
            emit=lambda line: print(f"{time.strftime('%H:%M:%S')} {line}", flush=True),
        )
        try:
            armed = True
            daemon.run(args.poll_interval, args.once, stop)
        except SyncerStopped:
            pass
        finally:
            armed = False
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if not args.once:
        print("syncer stopped", file=sys.stderr, flush=True)
