"""The trainer process: ``tenzro trainer run --key-file K --task-id T --spec S --rpc URL --p2p-key P
--bootstrap MULTIADDR [--rounds N]``.

What this module is: the SHELL that turns the trainer compute (``trainer/inner.py``, ``model.py``,
``data.py``) into a participant of a run. It enrolls over JSON-RPC, joins the node's gossip mesh
with its own libp2p identity, and per round:

1. holds the current global model, verified against the hash the run committed (``getRun``'s
   ``model_hash``). At start, or whenever it is behind (late join, restart, a RoundFinalized it
   missed), it gets the model over libp2p with a ``ModelRequest`` and checks it before training;
2. runs the inner loop on its shard, publishes each fragment's payload as ``PayloadChunk`` gossip,
   and calls ``submitOuterGradient`` with ONLY the payload hash, retrying while the node answers
   ``PayloadUnavailable`` (1312: its bridge has not reassembled the bytes yet), bounded by
   ``submit_timeout_s`` (the chunks are republished once on the way); past it, the same signed
   submission goes inline over JSON-RPC (gossip that never delivers, through loss or peers that
   forge chunks, costs time, not the round). A round closed to it (LateSubmission, RoundMismatch)
   is skipped, never fatal;
3. waits for the node's ``RoundFinalized`` gossip (as long as the deadlines getRun reports allow),
   applies the new fragment weights and checks the model hash against the message and against the
   round record the run committed;

until the run is Sealed (then it checks its model against the receipt's ``final_model_hash``) or
``--rounds`` rounds were trained. SIGINT/SIGTERM stop it cleanly (exit 0, host closed).

Everything that can refuse the trainer (spec, configs, dataset hash, layouts, p2p host) is checked
before it enrolls, i.e. before it stakes.

Restart safety: payload bytes depend on the torch thread count and GPU kernels, so a recomputed
payload may differ, and a second payload for a (task, round, fragment) is equivocation. Payloads
are saved (``PayloadStore``) before they are first published and a restarted trainer resubmits
the saved bytes; they are deleted once their round is finalized. A topk or q8 trainer's error
feedback is saved likewise (``FeedbackStore``), so a restart resumes it instead of starting
from zero (``resume_feedback``).

What it is NOT: the training math (``trainer/``), the protocol rules or message validation
(``tenzro_training.gossip``, ``gossip_trainer``), the libp2p host (``p2p/host.py``) or the node side
(``node/gossip_bridge.py``).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import logging
import os
import secrets
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rpc.errors import LimitExceeded, get_error_entry
from tenzro_training import auth
from tenzro_training.compression import ErrorFeedback, PayloadEncoding
from tenzro_training.errors import (
    Equivocation,
    InvalidState,
    LateSubmission,
    NotEnrolled,
    PayloadUnavailable,
    RoundMismatch,
    TenzroError,
)
from tenzro_training.fragments import FragmentLayout, TensorSpec
from tenzro_training.global_model import ModelLayout, compute_full_state, compute_state_model_hash
from tenzro_training.logformat import LOG_FORMATS, LOG_LEVELS, configure_logging, format_stderr_line
from tenzro_training.gossip import SeenCache
from tenzro_training.gossip_trainer import (
    TrainerGossipView,
    find_round_finalized_mismatch,
    validate_gossip_as_trainer,
)
from tenzro_training.payload import compute_max_payload_bytes, compute_payload_hash
from tenzro_training.terminal import printable
from tenzro_training.trainer import TrainerError, TrainerProcessError
from tenzro_training.trainer.feedback_store import FeedbackStore
from tenzro_training.trainer.inbox import GossipInbox
from tenzro_training.trainer.payload_store import PayloadStore
from tenzro_training.trainer.signing_guard import SigningGuard, SigningRefused

__all__ = [
    "PayloadStore",
    "TrainerProcessConfig",
    "TrainerProcessError",
    "compute_model_layout_from_view",
    "compute_round_wait_deadline_ms",
    "decode_fragment_weights",
    "get_rpc_error_code",
    "run_trainer",
    "run_trainer_from_args",
]

log = logging.getLogger("tenzro.trainer")


# JSON-RPC error codes of the node's answers the trainer acts on, from the node's own table
# (rpc/errors.py, docs/rpc.md "Errors").
CODE_INVALID_STATE = get_error_entry(InvalidState).code
"""The run is not Training any more (ended): the main loop reads getRun and stops or finishes."""
CODE_ROUND_MISMATCH = get_error_entry(RoundMismatch).code
"""The round is not the run's current one: skip it, go on with the current round."""
CODE_LATE_SUBMISSION = get_error_entry(LateSubmission).code
"""The round's accepted set closed (or it was finalized) while this trainer trained: skip it."""
CODE_NOT_ENROLLED = get_error_entry(NotEnrolled).code
"""Not (or no longer) an unslashed trainer of the run: this trainer is out."""
CODE_EQUIVOCATION = get_error_entry(Equivocation).code
"""Two different payloads for one (round, fragment): the stake was burned, this trainer is out."""
CODE_PAYLOAD_UNAVAILABLE = get_error_entry(PayloadUnavailable).code
"""The node's bridge has not reassembled the payload yet: retry."""
CODE_LIMIT_EXCEEDED = get_error_entry(LimitExceeded).code
"""The node refused the call unrun for load (docs/rpc.md "Resource limits"): retry, as when unreachable."""
_SKIP_ROUND_CODES = frozenset({CODE_INVALID_STATE, CODE_ROUND_MISMATCH, CODE_LATE_SUBMISSION})
_OUT_CODES = {CODE_NOT_ENROLLED: "it is not (or no longer) an unslashed trainer of the run",
              CODE_EQUIVOCATION: "it was slashed for equivocation"}


@dataclass(frozen=True, kw_only=True, slots=True)
class TrainerProcessConfig:
    """Everything one trainer process needs; checked on construction."""

    task_id: str
    rpc_url: str
    private_key: bytes
    spec_path: Path | None
    """The task's spec JSON; None: use the spec getRun serves (checked against spec_hash either way)."""
    p2p_key: Path
    bootstrap: tuple[str, ...]
    listen: tuple[str, ...] = ("/ip4/127.0.0.1/tcp/0",)
    chain_id: int = auth.DEFAULT_CHAIN_ID
    rounds: int | None = None
    """Stop after training this many rounds (None: until the run ends)."""
    did: str | None = None
    stake: int = 10**18
    batch_size: int = 16
    carry_optimizer_state: bool = False
    """Keep AdamW's moments from each trained round into the next, as DiLoCo's workers do; False
    (the default): a fresh AdamW state every round, which trained as well or better on the
    shipped models (docs/trainer-process.md "One round"). Held in memory only: after a restart
    the first round trained starts fresh."""
    device: str = "auto"
    """Where the inner loop runs: auto (CUDA if present, else MPS, else CPU), cpu, cuda, cuda:N, mps."""
    submit_timeout_s: float = 60.0
    """How long a hash-only submission is retried while the node lacks the payload."""
    model_timeout_s: float = 60.0
    """How long to wait for a ModelRequest answer; also the grace for a RoundFinalized once the
    round closed, and past the deadline getRun reports before a round that stays open is given up."""
    max_round_wait_s: float = 6 * 3600.0
    """Safety net only: the longest wait for one round to be finalized. The wait normally ends with
    the round (RoundFinalized, the run moving on or ending) or when the deadline getRun reports
    (round / finalize deadline, pushed back by each syncer failover) has passed."""
    state_dir: Path | None = None
    """Where payloads are kept until their round is finalized (restart safety); None:
    ``<directory of p2p_key>/tenzro-trainer-state``."""
    poll_interval_s: float = 0.2
    node_retry_s: float = 300.0
    """Once the trainer has reached its node, how long a call that cannot reach it (a node
    restart, a dropped connection) is retried before the trainer gives up (exit 3)."""

    def __post_init__(self) -> None:
        if len(self.private_key) != 32:
            raise TrainerProcessError("private_key must be 32 bytes")
        if self.rounds is not None and (isinstance(self.rounds, bool) or self.rounds < 1):
            raise TrainerProcessError(f"rounds must be >= 1, got {self.rounds!r}")
        if isinstance(self.batch_size, bool) or not isinstance(self.batch_size, int) or self.batch_size < 1:
            raise TrainerProcessError(f"batch_size must be an integer >= 1, got {self.batch_size!r}")
        if not isinstance(self.carry_optimizer_state, bool):
            raise TrainerProcessError(f"carry_optimizer_state must be a bool, got {self.carry_optimizer_state!r}")
        if not self.bootstrap:
            raise TrainerProcessError("at least one --bootstrap multiaddr (the node's p2p address) is needed")
        from tenzro_training.p2p.host import check_multiaddrs  # libp2p loads only for a trainer that runs

        try:
            check_multiaddrs(self.listen, self.bootstrap)
        except TenzroError as exc:
            raise TrainerProcessError(str(exc)) from None
        for name in ("submit_timeout_s", "model_timeout_s", "max_round_wait_s", "poll_interval_s", "node_retry_s"):
            if not getattr(self, name) > 0:
                raise TrainerProcessError(f"{name} must be > 0")


# --- pure helpers -----------------------------------------------------------------------------------


def compute_model_layout_from_view(view: dict[str, Any], layouts: tuple[FragmentLayout, ...]) -> ModelLayout:
    """The ModelLayout a node serves in getRun: the tensors its ``fragments`` slice plus its
    ``empty_tensors`` (zero-element ones: in the model hash, in no fragment)."""
    try:
        empty = [TensorSpec(t["name"], tuple(t["shape"]), "float32") for t in view.get("empty_tensors") or ()]
        return ModelLayout.from_views(layouts, empty)
    except (TenzroError, KeyError, TypeError, ValueError) as exc:
        raise TrainerProcessError(f"the node's empty_tensors are malformed: {exc}") from None


def decode_fragment_weights(data: bytes, layouts: tuple[FragmentLayout, ...]) -> list[torch.Tensor]:
    """Split concatenated little-endian fp32 fragment weights (fragment order) into one flat
    tensor per fragment; the length must match the layouts exactly."""
    total = sum(lay.numel for lay in layouts)
    if len(data) != 4 * total:
        raise TrainerProcessError(f"model weights: {len(data)} bytes, expected {4 * total}")
    flat = torch.from_numpy(np.frombuffer(data, dtype="<f4").astype(np.float32, copy=True))
    out, at = [], 0
    for lay in layouts:
        out.append(flat[at : at + lay.numel].clone())
        at += lay.numel
    return out


def _describe_device(device: torch.device) -> str:
    if device.type == "cuda":
        return f"{device} ({torch.cuda.get_device_name(device)})"
    return str(device)


def _hex(value: bytes) -> str:
    return "0x" + value.hex()


def _unhex(text: str) -> bytes:
    return bytes.fromhex(text[2:] if text.startswith("0x") else text)


def _feedback_round_outcome(view: dict[str, Any], round_: int, address: str, fragments: int) -> tuple[bytes, list[int]]:
    """From getRun's committed records: the model round ``round_`` was trained from, and the
    fragments whose aggregate did not take ``address``'s payload. CompressionError where the view
    does not say (no such record yet, or a malformed one: the answer is the node's, untrusted)."""
    from tenzro_training.compression import CompressionError

    try:
        records = view.get("round_records") or []
        if not 0 <= round_ < len(records):
            raise CompressionError(f"the run has no record of round {round_}")
        base = _unhex(view["initial_model_hash"] if round_ == 0 else records[round_ - 1]["model_hash"])
        outcome = records[round_]["fragments"]
        if len(outcome) != fragments:
            raise CompressionError(f"round {round_}'s record has {len(outcome)} fragments, not {fragments}")
        me = address.lower()
        missed = [f for f, fragment in enumerate(outcome) if me not in (str(a).lower() for a in fragment["accepted"])]
    except CompressionError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise CompressionError(f"getRun's record of round {round_} is malformed ({type(exc).__name__})") from None
    return base, missed


def get_rpc_error_code(exc: Exception) -> int | None:
    """The JSON-RPC error code a ``CliError`` from ``RpcClient.call`` carries, or None (a
    transport failure, not a node answer)."""
    code = getattr(exc, "rpc_code", None)
    return code if type(code) is int else None


def compute_round_wait_deadline_ms(view: dict[str, Any]) -> int | None:
    """The instant (node clock, ms) after which the node itself closes the current round: the
    finalize deadline once quorum was reached (each syncer failover pushes it back), else the
    round deadline (the run Fails without quorum). None if getRun names neither."""
    if view.get("finalize_deadline_ms") is not None:
        return int(view["finalize_deadline_ms"])
    if view.get("quorum_at_ms") is None and view.get("round_deadline_ms") is not None:
        return int(view["round_deadline_ms"])
    nxt = view.get("next_deadline_ms")
    return None if nxt is None else int(nxt)


# --- the process -----------------------------------------------------------------------------------


class _Trainer:
    MODEL_CHASE_TIMEOUTS = 5
    """A ModelRequest that follows the run gives up after this many ``model_timeout_s`` in all."""
    MODEL_ASK_INTERVAL_S = 2.0
    """How often an unanswered ModelRequest is sent again (the node answers one per trainer per
    ``MODEL_REQUEST_INTERVAL_S``, 5 s, and limits the rest)."""

    def __init__(self, cfg: TrainerProcessConfig, announce: Callable[[str], None]) -> None:
        from eth_account import Account

        from tenzro_training.cli.client import RpcClient

        self.cfg = cfg
        self.say: Callable[[str], None] = lambda line: announce(printable(line))
        """Every line goes through terminal.printable: most carry the node's text."""
        self.client = RpcClient(cfg.rpc_url, timeout=60.0)
        self.reached_node = False
        """Set by the first answer: before it an unreachable node is a setup error (exit 3)."""
        self.reconnected_at: float | None = None
        """When the node last answered again after being unreachable (monotonic): a restart, which
        may have lost the RoundFinalized of a round it had just committed (``wait_finalized``)."""
        self.stopping = threading.Event()
        """Set with the stop event (SIGINT/SIGTERM): the inner loop, on its own thread, ends
        before its next step instead of finishing the round."""
        self.inline_submissions = 0
        """Payloads sent inline over JSON-RPC because gossip did not deliver them in time."""
        self.address = str(Account.from_key(cfg.private_key).address)
        self.addr_bytes = _unhex(self.address)
        self.weights: list[torch.Tensor] | None = None
        self.held_hash: bytes | None = None
        self.optimizer_state: dict[str, Any] | None = None
        """AdamW's state after the last round trained (``carry_optimizer_state``), on the device."""
        self.encoding = PayloadEncoding()
        """The task's payload encoding (``prepare`` reads it from the spec)."""
        self.feedback: ErrorFeedback | None = None
        """What top-k or q8 left unsent, per fragment (a topk or q8 task only; saved every round in
        ``feedback_store``, where a restart resumes it: ``resume_feedback``)."""
        self.feedback_round: int | None = None
        """The round whose payloads ``feedback`` last made (``unsend`` applies to it only)."""
        self.gossip_limits: tuple[int, int] | None = None
        self.gossip_view: TrainerGossipView | None = None
        self.payloads = PayloadStore(cfg.state_dir or cfg.p2p_key.parent / "tenzro-trainer-state",
                                     cfg.task_id, self.address)
        self.feedback_store = FeedbackStore(self.payloads.dir)
        self.guard: SigningGuard | None = None
        """What this account signed for the task (opened with the state directory's lock)."""
        self.max_rounds = 2**64
        """The run's spec's max_rounds, once the spec is loaded: a round at or past it is bogus."""
        self.spec_hash: str | None = None
        """The run's spec hash, once the spec is loaded: every later getRun must name it."""

    async def call(self, method: str, params: dict[str, Any]) -> Any:
        """One JSON-RPC call. Once the node has answered a first time, a call that cannot reach
        it is retried with backoff for up to ``node_retry_s``: a trainer exited on the first
        refused connection, so a node restart ended every trainer that happened to be calling
        it and the run failed at its round timeout (trainer restart probe). Every call is
        replay-safe (the node answers a repeated enrollment or submission as a no-op), so a
        call that reached the node but lost its answer may be sent again."""
        from tenzro_training.cli.exits import EXIT_UNREACHABLE, CliError

        deadline: float | None = None
        delay = 0.5
        while True:
            try:
                result = await asyncio.to_thread(self.client.call, method, params)
            except CliError as exc:
                unreachable = exc.exit_code == EXIT_UNREACHABLE and get_rpc_error_code(exc) is None
                busy = get_rpc_error_code(exc) == CODE_LIMIT_EXCEEDED  # nothing was run: resend it
                if not ((unreachable and self.reached_node) or busy):
                    raise
                now = time.monotonic()
                if deadline is None:
                    deadline = now + self.cfg.node_retry_s
                    what = "busy" if busy else "unreachable"
                    self.say(f"node {what} ({exc}); retrying for up to {self.cfg.node_retry_s:.0f} s")
                if now >= deadline:
                    raise
                await asyncio.sleep(min(delay, deadline - now))
                delay = min(2 * delay, 5.0)
                continue
            if deadline is not None:
                self.say("node reachable again")
                self.reconnected_at = time.monotonic()
            self.reached_node = True
            return result

    async def get_run(self) -> dict[str, Any]:
        view = await self.call("tenzro_training_getRun", {"task_id": self.cfg.task_id})
        if view.get("task_id") != self.cfg.task_id:
            raise TrainerProcessError(f"the node answered getRun of {self.cfg.task_id} with another run's view "
                                      f"({view.get('task_id')!r})")
        if type(view.get("round")) is not int or not 0 <= view["round"] < 2**64:  # int() took 2.9 as round 2
            raise TrainerProcessError(f"the node's getRun answer is malformed: round {view.get('round')!r}")
        if self.spec_hash is not None and str(view.get("spec_hash", "")).lower() != self.spec_hash:
            # The spec was checked once; every later answer must be of that same run.
            raise TrainerProcessError(f"the node's getRun answer names spec {view.get('spec_hash')!r}, not the "
                                      f"run's {self.spec_hash}")
        records = view.get("round_records")
        if view.get("status") == "Training" and (not isinstance(records, list) or len(records) != view["round"]):
            # A node serves round r with the r records before it (one RunState): anything else
            # is forged or broken, and the trainer would prune or train by it.
            raise TrainerProcessError(f"the node's getRun answer is inconsistent: round {view['round']} with "
                                      f"{len(records) if isinstance(records, list) else 'no'} round records")
        if self.gossip_limits is not None:
            # What the topic validators (trio thread) read: swapped whole, never mutated.
            max_payload, max_model = self.gossip_limits
            try:
                self.gossip_view = TrainerGossipView.from_run_view(
                    view, chain_id=self.cfg.chain_id, max_payload_bytes=max_payload, max_model_bytes=max_model,
                    payload_bytes=getattr(self, "payload_limits", ()),
                )
            except ValueError as exc:
                raise TrainerProcessError(f"the node's getRun answer is malformed: {exc}") from None
        return view

    def sign(self, msg: auth.SignedMessageType) -> bytes:
        return auth.sign_message(msg, self.cfg.private_key, self.cfg.chain_id)

    # --- setup ---

    def load_spec(self, view: dict[str, Any]) -> Any:
        """The run's spec: from ``--spec`` if given, else the one getRun serves; either way it
        must hash to the run's spec_hash, which the receipt commits (so a node cannot make a
        trainer train on a spec other than the one it is paid under)."""
        from tenzro_training.spec import TrainingTaskSpec

        if self.cfg.spec_path is None:
            where, obj = "the node's spec", view.get("spec")
        else:
            where = f"spec {self.cfg.spec_path}"
            from storage.files import NotReadable, read_regular_file
            from tenzro_training.jsontext import loads_bounded

            try:
                obj = loads_bounded(read_regular_file(self.cfg.spec_path, 64 << 20))
            except NotReadable as exc:
                raise TrainerProcessError(f"cannot read {where}: {exc.reason}") from None
            except ValueError as exc:
                raise TrainerProcessError(f"{where} is not valid JSON: {exc}") from None
        try:
            spec = TrainingTaskSpec.from_dict(obj)
        except TenzroError as exc:
            raise TrainerProcessError(f"{where} is invalid: {exc}") from None
        if spec.task_id != self.cfg.task_id:
            raise TrainerProcessError(f"{where} is for {spec.task_id!r}, not {self.cfg.task_id!r}")
        if _hex(spec.spec_hash()) != view["spec_hash"]:
            raise TrainerProcessError(f"{where} hashes to {_hex(spec.spec_hash())}, the run's is {view['spec_hash']}")
        return spec

    async def enroll(self, view: dict[str, Any], stop: asyncio.Event) -> dict[str, Any]:
        while view["status"] in ("Posted", "Electing") and not stop.is_set():  # enrollment not open yet
            await asyncio.sleep(self.cfg.poll_interval_s)
            view = await self.get_run()
        if any(t["address"].lower() == self.address.lower() for t in view["trainers"]):
            # A restart: already enrolled. If this process created the signing record, whatever
            # was signed before came from another state directory: the record starts after the
            # run's round as of this answer too (the first answer may have been stale or forged).
            if self.guard is not None and view["status"] not in ("Posted", "Electing", "Enrolling"):
                self.guard.raise_floor(min(self.max_rounds, view["round"] + 1))
            return view
        if view["status"] != "Enrolling":
            raise TrainerProcessError(f"cannot enroll: the run is {view['status']}")
        did = self.cfg.did or f"did:tenzro:trainer:{self.address.lower()}"
        msg = auth.EnrollTrainer(task_id=self.cfg.task_id, did=did, trainer=self.addr_bytes, stake=self.cfg.stake)
        res = await self.call("tenzro_training_enrollTrainer", {
            "task_id": self.cfg.task_id, "did": did, "address": self.address, "stake": str(self.cfg.stake),
            "signature": _hex(self.sign(msg)),
        })
        self.say(f"enrolled {self.address} in {self.cfg.task_id} shard {res['shard']}")
        return await self.get_run()

    async def wait_training(self, stop: asyncio.Event) -> dict[str, Any]:
        """The first view past enrollment, within ``max_round_wait_s`` (a node answering
        "Enrolling" forever held a bonded trainer forever; trainer probe, 2026-11-26)."""
        deadline = time.monotonic() + self.cfg.max_round_wait_s
        while not stop.is_set():
            view = await self.get_run()
            if view["status"] not in ("Posted", "Electing", "Enrolling"):
                return view
            if time.monotonic() >= deadline:
                raise TrainerProcessError(f"{self.cfg.task_id} did not start training within --max-round-wait "
                                          f"{self.cfg.max_round_wait_s:g}s (still {view['status']})")
            await asyncio.sleep(self.cfg.poll_interval_s)
        raise asyncio.CancelledError

    # --- the model ---

    def verify_weights(self, data: bytes, model_hash: bytes) -> list[torch.Tensor] | None:
        """The fragment weights in ``data`` if they fit the layouts and hash to ``model_hash``,
        else None (the inbox drops such a candidate stream)."""
        try:
            weights = decode_fragment_weights(data, self.layouts)
        except TrainerProcessError:
            return None
        return weights if compute_state_model_hash(self.model, weights) == model_hash else None

    def accept_weights(self, data: bytes | list[torch.Tensor], expected_hash: bytes, what: str) -> None:
        """Hold ``data`` (raw or decoded weights) as the model; TrainerProcessError unless they
        hash to ``expected_hash`` (callers drop that candidate and keep waiting)."""
        weights = decode_fragment_weights(data, self.layouts) if isinstance(data, (bytes, bytearray)) else data
        got = compute_state_model_hash(self.model, weights)
        if got != expected_hash:
            raise TrainerProcessError(f"{what}: the weights hash to {_hex(got)}, the run committed {_hex(expected_hash)}")
        self.weights, self.held_hash = weights, got

    async def request_model(self, view: dict[str, Any], stop: asyncio.Event) -> dict[str, Any]:
        """ModelRequest until this trainer holds the model the run commits, and return the view
        that commits it (the run may have moved on meanwhile; callers go on from that view).

        The node answers with the model it holds WHEN it answers, at most once per
        ``MODEL_REQUEST_INTERVAL_S`` per trainer, so the model wanted follows the run: an
        answer for a later round is taken once getRun shows the run commits it, and each
        re-ask first looks at getRun. Pinned to the round it first saw, a trainer whose rounds
        were shorter than that interval dropped every answer as unexpected and gave up; taking
        an outrun answer would cost a whole inner loop on a round already closed."""
        g = self.g
        target = _model_target(view)
        deadline = time.monotonic() + self.cfg.model_timeout_s
        # Following the run restarts the deadline; this bounds the whole chase (rounds shorter
        # than an answer's round trip would outrun every answer, for as long as the run lasts).
        give_up = time.monotonic() + self.MODEL_CHASE_TIMEOUTS * self.cfg.model_timeout_s
        next_ask = 0.0
        self.inbox.expect_model(target[0])
        try:
            while not stop.is_set():
                for data_hash, (round_, model_hash, data) in list(self.inbox.models.items()):
                    view = await self.get_run()  # is this the model the run commits NOW?
                    if view["status"] not in ("Training", "Sealed"):
                        return view  # the run ended: the caller says so
                    if _model_target(view) != target:
                        target, deadline = _model_target(view), time.monotonic() + self.cfg.model_timeout_s
                        self.inbox.expect_model(target[0])
                    if (round_, model_hash) != target:
                        # Older than the run (outrun while it travelled), or not a model the run
                        # ever committed: drop it, keep waiting.
                        self.inbox.discard_model(data_hash)
                        if round_ >= target[0]:
                            self.inbox.counters["forged"] += 1
                            log.warning("dropped a ModelRequest answer for round %d: the run commits %s, not %s",
                                        round_, _hex(target[1]), _hex(model_hash))
                        continue
                    try:
                        self.accept_weights(data, target[1], f"ModelRequest answer for round {round_}")
                    except TrainerProcessError as exc:  # a forged answer: drop it, keep waiting
                        self.inbox.discard_model(data_hash)
                        self.inbox.counters["forged"] += 1
                        log.warning("dropped a ModelRequest answer: %s", exc)
                        continue
                    self.say(f"model round {round_} hash {_hex(target[1])} from ModelRequest verified")
                    return view
                now = time.monotonic()
                if now >= next_ask:
                    if next_ask:  # not the first ask: the run may have moved on since
                        view = await self.get_run()
                        if view["status"] not in ("Training", "Sealed"):
                            return view
                        if _model_target(view) != target:
                            target, deadline = _model_target(view), now + self.cfg.model_timeout_s
                            self.inbox.expect_model(target[0])
                    if now > deadline:
                        raise TrainerProcessError(
                            f"no verified model for round {target[0]} within {self.cfg.model_timeout_s:g}s")
                    if now > give_up:
                        raise TrainerProcessError(
                            f"no verified model within {self.MODEL_CHASE_TIMEOUTS * self.cfg.model_timeout_s:g}s: "
                            f"the run moved on faster than the node's answers arrived (now at round {target[0]}; "
                            f"rounds shorter than its answer interval, 5 s, cannot be joined)")
                    req = g.compute_model_request(task_id=self.cfg.task_id, round=target[0], nonce=secrets.randbits(63),
                                                  private_key=self.cfg.private_key, chain_id=self.cfg.chain_id)
                    await self.host.publish(g.get_topic(req), g.encode_message(req))
                    next_ask = now + self.MODEL_ASK_INTERVAL_S
                await self.inbox.wait(min(0.2, self.MODEL_ASK_INTERVAL_S))
            return view
        finally:
            self.inbox.expect_model(None)  # prune: nothing else is awaited

    # --- one round ---

    def train(self, round_: int) -> list[bytes]:
        from tenzro_training.trainer.inner import compute_outer_gradients, make_payloads, run_inner_loop

        assert self.weights is not None
        state = compute_full_state(self.model, self.weights)
        # The carried moments are handed over, not copied (a second copy would sit on the device
        # all round), so they are dropped here first: a round that raises leaves a fresh state,
        # never one half updated.
        carried, self.optimizer_state = self.optimizer_state, None
        res = run_inner_loop(
            state, self.inner_cfg, self.model_cfg, self.shard, round_, self.shard_index,
            optimizer_state=carried if self.cfg.carry_optimizer_state else None, take_optimizer_state=True,
            device=self.device, should_stop=self.stopping.is_set,
        )
        del carried
        if self.cfg.carry_optimizer_state:
            self.optimizer_state = res.optimizer_state
        grads = compute_outer_gradients(state, res.state, self.layouts)
        self.last_loss = res.train_loss
        if self.encoding.has_feedback and self.feedback is None:
            self.feedback = ErrorFeedback(self.layouts, self.encoding)
        payloads = make_payloads(self.cfg.task_id, round_, self.layouts, grads, self.payload_dtype, self.feedback)
        self.feedback_round = round_
        if self.feedback is not None:  # BEFORE the payloads are saved: a resubmission finds it
            self.feedback_store.save(round_, self.feedback.to_bytes(self._feedback_metadata(round_)))
        return payloads

    def _feedback_metadata(self, round_: int) -> dict[str, str]:
        """What ties a saved error-feedback state to its run: the task, this trainer, the round
        and the model it was trained from (a task id reused on another node has other models)."""
        assert self.held_hash is not None
        return {"task_id": self.cfg.task_id, "trainer": self.address.lower(), "round": str(round_),
                "base": _hex(self.held_hash)}

    def resume_feedback(self, round_: int, view: dict[str, Any], *, resubmitting: bool) -> None:
        """A restarted topk or q8 trainer about to submit ``round_``: continue the error feedback
        from the state saved on disk (FeedbackStore), not from zero.

        Resubmitting ``round_``'s saved payloads: the state that round left, with its sent
        values held for ``unsend`` (as if this process had made them). Training ``round_``
        afresh: the newest state of an earlier round q, whose sent values go back into the
        residual for the fragments round q's committed record did not aggregate from this
        trainer (late, skipped, refused), exactly what ``unsend`` did in the process that
        stopped. A state that does not belong to this run and model is left unused (said),
        never fatal: the run goes on from zero, as before states were saved."""
        from tenzro_training.compression import CompressionError

        if resubmitting:
            data = self.feedback_store.load(round_)
            found = None if data is None else (round_, data)
        else:
            found = self.feedback_store.newest_before(round_)
        if found is None:
            if resubmitting:
                self.say(f"error feedback starts from zero: no state was saved with round {round_}'s payloads")
            elif round_ > 0:
                self.say(f"error feedback starts from zero: no state was saved before round {round_}")
            self._start_feedback_from_zero()
            return
        saved_round, data = found
        try:
            feedback, metadata = ErrorFeedback.from_bytes(self.layouts, self.encoding, data)
            if resubmitting:
                assert self.held_hash is not None  # get_payloads checked
                base, missed = self.held_hash, []
            else:
                base, missed = _feedback_round_outcome(view, saved_round, self.address, len(self.layouts))
            want = {"task_id": self.cfg.task_id, "trainer": self.address.lower(), "round": str(saved_round),
                    "base": _hex(base)}
            for key, value in want.items():
                if metadata.get(key) != value:
                    raise CompressionError(f"it was saved for {key} {str(metadata.get(key))[:80]}, not {value}")
        except CompressionError as exc:
            self.say(f"error feedback starts from zero: {self.feedback_store.path(saved_round)} is not "
                     f"this run's ({exc})")
            self._start_feedback_from_zero()
            return
        self.feedback = feedback
        self.feedback_store.prune(saved_round)  # no later restart reads an older state
        if resubmitting:
            self.feedback_round = round_
            self.say(f"error feedback resumed from the state saved with round {round_}'s payloads")
            return
        restored = feedback.restore_unsent(missed)
        self.feedback_round = None
        self.say(f"error feedback resumed from round {saved_round}'s saved state"
                 + (f" ({restored} fragments it did not aggregate from this trainer put back)" if restored else ""))

    def _start_feedback_from_zero(self) -> None:
        """Hold a zero error-feedback state from here on. Left unset, the next round read the
        same refused file again and said so twice; or, after resubmitting round r without its
        state, it resumed from round r-1's, whose residual holds what round r's payloads had
        already sent (trainer kill campaign)."""
        self.feedback = ErrorFeedback(self.layouts, self.encoding)
        self.feedback_round = None

    def unsend(self, round_: int, fragments: range) -> None:
        """``fragments`` of ``round_`` will not be aggregated: with error feedback, their sent
        values go back into the residual (for payloads this process made, or resubmits with the
        state saved with them: ``resume_feedback``)."""
        if self.feedback is not None and self.feedback_round == round_ and len(fragments):
            self.feedback.restore_unsent(fragments)
            self.feedback_round = None

    async def publish_payload(self, round_: int, fragment: int, payload: bytes, signature: bytes) -> None:
        g = self.g
        for chunk in g.compute_payload_chunks(
            task_id=self.cfg.task_id, round=round_, fragment=fragment, trainer=self.addr_bytes,
            signature=signature, payload=payload,
        ):
            await self.host.publish(g.get_topic(chunk), g.encode_message(chunk))

    def open_signing_guard(self, view: dict[str, Any]) -> None:
        """Open the record of signatures (state directory lock held; spec loaded), BEFORE
        enrolling: a damaged record stops the trainer here. A record created while this account
        is already enrolled begins after the run's current round, which may have been signed
        from another state directory (signing_guard.py), and never past the spec's rounds."""
        enrolled = any(str(t.get("address", "")).lower() == self.address.lower()
                       for t in view.get("trainers") or [] if isinstance(t, dict))
        floor = None
        if enrolled:
            started = view.get("status") not in ("Posted", "Electing", "Enrolling")
            floor = min(self.max_rounds, view["round"] + 1 if started else 0)
        self.signing_guard(floor_if_new=floor)

    def signing_guard(self, floor_if_new: int | None = None) -> SigningGuard:
        """The SigningGuard of this (task, account), opened on first use (``run`` opens it
        with the state directory's lock held)."""
        if self.guard is None:
            try:
                self.payloads.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
            except OSError as exc:
                raise TrainerProcessError(f"cannot use state directory {self.payloads.dir}: {exc.strerror}") from None
            self.guard = SigningGuard(self.payloads.dir, floor_if_new=floor_if_new)
        return self.guard

    async def submit(self, round_: int, payloads: list[bytes], stop: asyncio.Event) -> bool:
        """Publish and submit every fragment's payload; True once all were accepted, False when
        the node says the round is no longer open to this trainer (LateSubmission, RoundMismatch,
        the run left Training): the round is skipped, never fatal. TrainerProcessError when the
        node says this trainer is out (slashed, not enrolled) or refuses otherwise."""
        from tenzro_training.cli.exits import CliError

        signed = []
        guard = self.signing_guard()
        digests = [compute_payload_hash(payload) for payload in payloads]
        try:
            for f, digest in enumerate(digests):  # every fragment first: a round is never half signed, then refused
                guard.check(round_, f, digest)
        except SigningRefused:
            self.unsend(round_, range(len(payloads)))
            raise
        for f, payload in enumerate(payloads):
            digest = digests[f]
            try:
                guard.record(round_, f, digest)  # durably, BEFORE signing; SigningRefused if it would equivocate
            except SigningRefused:
                self.unsend(round_, range(f, len(payloads)))
                raise
            sig = self.sign(auth.SubmitOuterGradient(task_id=self.cfg.task_id, round=round_, fragment=f, payload_hash=digest))
            signed.append((digest, sig))
            await self.publish_payload(round_, f, payload, sig)
        # An earlier fragment of this round had to be sent again: its payload was published with
        # the others, so theirs were most likely lost too (a node restarted while they travelled).
        gossip_lost = False
        for f, (digest, sig) in enumerate(signed):
            deadline = time.monotonic() + self.cfg.submit_timeout_s
            # Each fragment waited its own quarter budget before republishing, one after the
            # other: ~15 s x F after a node restart (node kill campaign). Once one was lost, the
            # next is republished at its first "unavailable".
            republish_at = time.monotonic() + (0.0 if gossip_lost else self.cfg.submit_timeout_s / 4)
            tries = 0
            inline = False
            while True:
                tries += 1
                params: dict[str, Any] = {"task_id": self.cfg.task_id, "round": round_, "fragment": f,
                                          "signature": _hex(sig)}
                if inline:
                    params["payload"] = base64.b64encode(payloads[f]).decode("ascii")
                else:
                    params["payload_hash"] = _hex(digest)
                try:
                    await self.call("tenzro_training_submitOuterGradient", params)
                    break
                except CliError as exc:
                    code = get_rpc_error_code(exc)
                    if code in _SKIP_ROUND_CODES:
                        # Normal for a trainer outside the first K of a round, or one the round
                        # was finalized without: no stake is at risk, the next round is open to it.
                        log.warning("round %d fragment %d not accepted, skipping the round: %s", round_, f, exc)
                        self.say(f"round {round_} skipped: {exc}")
                        self.unsend(round_, range(f, len(payloads)))  # the ones before f were accepted
                        return False
                    if code in _OUT_CODES:
                        raise TrainerProcessError(
                            f"this trainer is out of {self.cfg.task_id}: {_OUT_CODES[code]} ({exc})"
                        ) from None
                    if code != CODE_PAYLOAD_UNAVAILABLE or stop.is_set():
                        raise
                    now = time.monotonic()
                    if now > deadline:
                        if inline:  # cannot happen (an inline payload is never "unavailable"): a node bug
                            raise TrainerProcessError(
                                f"round {round_} fragment {f}: the node never held payload {_hex(digest)}"
                            ) from None
                        # Gossip did not get the payload to the node (peers that drop or forge
                        # chunks, a partition): the same signed submission goes inline over
                        # JSON-RPC instead, the path that needs no gossip at all.
                        log.warning("round %d fragment %d: the node never held payload %s over gossip "
                                    "(%d tries in %gs); sending it inline over JSON-RPC",
                                    round_, f, _hex(digest), tries, self.cfg.submit_timeout_s)
                        self.say(f"round {round_} fragment {f}: gossip did not deliver the payload; sent inline")
                        self.inline_submissions += 1
                        inline = gossip_lost = True
                        continue
                    if now > republish_at:  # gossip may have lost a chunk: send the payload again
                        await self.publish_payload(round_, f, payloads[f], sig)
                        republish_at = deadline + 1
                        gossip_lost = True
                    await asyncio.sleep(min(0.05 * tries, 0.5))
            log.info("round %d fragment %d accepted after %d tries", round_, f, tries)
        return True

    async def wait_finalized(self, round_: int, stop: asyncio.Event) -> dict[str, Any]:
        """Wait for RoundFinalized(round_) over gossip, apply and verify it; if the run moved on
        without it reaching us, fall back to a ModelRequest. Returns the latest view.

        How long: while getRun shows the round open, as long as the node's own deadline for it
        (``compute_round_wait_deadline_ms``: a failover pushes it back) has not passed by more
        than ``model_timeout_s``; once the round closed, ``model_timeout_s / 2`` more for its
        RoundFinalized; ``max_round_wait_s`` caps the whole wait (a safety net)."""
        started = time.monotonic()
        safety_net = started + self.cfg.max_round_wait_s
        grace_ms = int(self.cfg.model_timeout_s * 1000)
        moved_at: float | None = None
        seen_open = started  # the last poll that showed the round still open
        last_poll = -1e18
        poll_every = 5 * self.cfg.poll_interval_s
        view: dict[str, Any] | None = None
        self.inbox.expect_finalized(round_)
        # Held notices are checked against the node's record when new ones arrive (at most every
        # min_gap) and otherwise with the polls. Notices for a round the node has no record of
        # yet (a ranked candidate can sign one early) were rechecked on every wake-up: each
        # trainer called getRun 5 times a second until the round closed (coverage probe).
        checked: frozenset[bytes] = frozenset()
        last_check = -1e18
        min_gap = min(0.2, poll_every)
        while not stop.is_set():
            now = time.monotonic()
            held = frozenset(self.inbox.finalized)
            fetched: dict[str, Any] | None = None
            if held and ((held != checked and now - last_check >= min_gap) or now - last_poll >= poll_every):
                checked, last_check, last_poll = held, now, now
                view = fetched = await self.get_run()
                records = view["round_records"]
                # Until the node has a record of the round the notice cannot be checked: it is held
                # (a ranked candidate could sign one early) and the deadline below still runs.
                if len(records) > round_:
                    committed = _unhex(records[round_]["model_hash"])
                    syncer = _unhex(records[round_]["syncer"])
                    for data_hash, (msg, data) in list(self.inbox.finalized.items()):
                        problem = find_round_finalized_mismatch(msg, syncer, committed, self.cfg.chain_id)
                        if problem is None:
                            try:
                                self.accept_weights(data, committed, f"RoundFinalized round {round_}")
                            except TrainerProcessError as exc:
                                problem = str(exc)
                        if problem is None:
                            self.inbox.expect_finalized(None)  # prune: used
                            self.say(f"round {round_} finalized model {_hex(committed)} verified")
                            return view
                        # A ranked candidate that is not this round's syncer can sign a well-formed
                        # notice the topic validator passes. Never crash on it: drop it.
                        log.warning("discarded a RoundFinalized for round %d: %s", round_, problem)
                        self.inbox.discard_finalized(data_hash)
                    # None matched: fetch the committed model (the real notice may have been
                    # skipped while these were held).
                    self.inbox.expect_finalized(None)
                    return await self.request_model(view, stop)
            if fetched is not None or now - last_poll >= poll_every:
                if fetched is None:
                    last_poll = now
                    view = await self.get_run()
                moved = len(view["round_records"]) > round_ or view["status"] != "Training"
                if moved and view["status"] not in ("Training", "Sealed"):
                    self.inbox.expect_finalized(None)
                    return view  # the run ended (Failed, ...): the main loop says so
                if moved:
                    moved_at = now if moved_at is None else moved_at
                    # The round closed while the node was out of reach (it restarted): a node
                    # killed between committing the round and publishing its RoundFinalized never
                    # publishes it, and the grace below cost every trainer ~30 s, even on a run
                    # already Sealed (node kill campaign). Ask for the model at once instead.
                    restarted = self.reconnected_at is not None and self.reconnected_at > seen_open
                    if restarted or now - moved_at >= self.cfg.model_timeout_s / 2:
                        # The round closed but its RoundFinalized never arrived: ask for the model.
                        self.inbox.expect_finalized(None)
                        return await self.request_model(view, stop)
                else:
                    seen_open = time.monotonic()  # after the poll: a reconnect inside it came before
                    due = compute_round_wait_deadline_ms(view)
                    node_now = view.get("now_ms")
                    if not isinstance(node_now, int):  # an older node: our clock stands in for its
                        node_now = int(time.time() * 1000)
                    if due is not None and node_now > due + grace_ms:
                        raise TrainerProcessError(
                            f"round {round_} is still open {(node_now - due) / 1000:.0f}s after the deadline the "
                            f"node reports ({due} ms): the node is not advancing the run"
                        )
                if now > safety_net:
                    raise TrainerProcessError(
                        f"round {round_} was not finalized within --max-round-wait {self.cfg.max_round_wait_s:g}s"
                    )
            await self.inbox.wait(min(0.2, poll_every))
        raise asyncio.CancelledError

    # --- main ---

    async def run(self, stop: asyncio.Event) -> int:
        from tenzro_training import gossip as g

        self.g = g
        try:  # before anything is staked: a trainer asked for a GPU it lacks stops here
            from tenzro_training.trainer.inner import resolve_device

            self.device = resolve_device(self.cfg.device)
        except TrainerError as exc:
            raise TrainerProcessError(str(exc)) from None
        view = await self.get_run()
        state_lock = self.payloads.lock()  # first: a second process of this account stops here
        try:
            return await self._run(view, stop)
        finally:
            os.close(state_lock)

    async def _run(self, view: dict[str, Any], stop: asyncio.Event) -> int:
        from tenzro_training.cli.layouts import compute_layouts_from_view
        from tenzro_training.p2p.host import P2PConfig, P2PError, P2PHost, get_peer_ids
        from tenzro_training.p2p.keys import PeerKeyError

        cfg, g = self.cfg, self.g
        # Everything that can refuse this trainer is checked BEFORE it enrolls (stakes): the spec,
        # model and inner-loop configs, the dataset and its hash, the layouts, the p2p host. Only
        # the shard waits for the shard index, which enrollment assigns.
        spec = self.load_spec(view)
        if isinstance(view.get("spec_hash"), str):  # load_spec checked the spec against it
            self.spec_hash = view["spec_hash"].lower()
        self.max_rounds = spec.max_rounds
        self.open_signing_guard(view)
        corpus = await self.prepare(spec)
        self.layouts = compute_layouts_from_view(view)
        self.model = compute_model_layout_from_view(view, self.layouts)
        self.check_layouts_fit_model(spec)
        # The largest payload the node can accept for any fragment, and the model size.
        self.gossip_limits = (
            max(compute_max_payload_bytes(lay) for lay in self.layouts),
            4 * sum(lay.numel for lay in self.layouts),
        )
        self.payload_limits = tuple(compute_max_payload_bytes(lay) for lay in self.layouts)

        self.host = P2PHost(P2PConfig(key_path=cfg.p2p_key, listen=cfg.listen, bootstrap=cfg.bootstrap))
        try:
            # Inside the try: a start that fails half-way (listening, not yet subscribed) still
            # closes the host and its trio thread.
            await self.host.start()
            await self.wait_for_bootstrap(stop)
            view = await self.enroll(await self.get_run(), stop)
            self.say(f"tenzro trainer {self.address} p2p {self.host.addrs[0]}")
            moments = "carried from round to round" if cfg.carry_optimizer_state else "fresh each round"
            self.say(f"inner loop on {_describe_device(self.device)}, AdamW state {moments}")
            if self.encoding.has_feedback:
                self.say(f"outer gradients sent as {self.encoding.describe()} of each fragment, with "
                         f"{self.encoding.describe_feedback()}")
                self.say(f"error feedback saved each round in {self.feedback_store.dir}")
            seen = SeenCache()  # both topic validators' (one trio thread); the inbox forgets dropped streams in it
            self.inbox = GossipInbox(cfg.task_id, g, 4 * sum(lay.numel for lay in self.layouts),
                                verify=self.verify_weights, seen=seen)
            drains = []
            for topic in (g.TOPIC_TRAINING, g.TOPIC_SYNCER):
                self.host.set_validator(topic, _trainer_validator(topic, lambda: self.gossip_view, seen,
                                                                  model_sources=get_peer_ids(cfg.bootstrap)))
                drains.append(asyncio.create_task(self.inbox.drain(await self.host.subscribe(topic))))
            for topic in (g.TOPIC_TRAINING, g.TOPIC_SYNCER):
                # Publishing before a peer's subscription is known would send into the void.
                await self.host.wait_for_peers(topic, 1, timeout=cfg.model_timeout_s)
            try:
                return await self._rounds(stop, corpus)
            finally:
                for task in drains:
                    task.cancel()
        except (P2PError, PeerKeyError) as exc:
            # The host's own failures (a listen address taken, a peer key in use, unreadable or
            # open to others, no peer subscribed in time) stop the trainer like any other: exit 1
            # and their one line (docs/trainer-process.md), not the CLI's exit 2 for bad usage.
            raise TrainerProcessError(str(exc)) from exc
        finally:
            await self.host.stop()

    async def wait_for_bootstrap(self, stop: asyncio.Event) -> None:
        """Until a ``--bootstrap`` peer (the node) has a pubsub stream with this host, for up to
        ``model_timeout_s``; BEFORE enrolling. A trainer that cannot hear its node can neither
        take the global weights nor publish its payloads, and it used to enroll (stake bonded,
        a slot taken) and only then give up (trainer restart probe)."""
        from tenzro_training.p2p.host import get_peer_ids

        wanted = get_peer_ids(self.cfg.bootstrap)
        deadline = time.monotonic() + self.cfg.model_timeout_s
        while not wanted & set(self.host.connected_peers()):
            if stop.is_set():
                raise TrainerProcessError("stopped before a --bootstrap peer answered (nothing staked)")
            if time.monotonic() >= deadline:
                raise TrainerProcessError(
                    f"no --bootstrap peer answered on gossip within {self.cfg.model_timeout_s:g} s "
                    f"(nothing staked): check that the node runs with --p2p-listen and that its p2p "
                    f"address ({', '.join(self.cfg.bootstrap)}) is reachable from here"
                )
            await asyncio.sleep(self.cfg.poll_interval_s)

    def check_layouts_fit_model(self, spec: Any) -> None:
        """The node's fragment layouts must cut exactly the tensors (names, shapes) of the model
        the spec describes, BEFORE enrolling. They were checked only against the layout hashes
        the same node states, so another model's layouts passed and the trainer failed in its
        inner loop with the stake bonded (trainer probe, 2026-11-26)."""
        from tenzro_training.trainer.model import compute_shape_mismatch, get_adapter

        want = get_adapter(spec.architecture.family).tensor_shapes(self.model_cfg)
        # Every tensor the layouts cut, and the zero-element ones they cannot (``empty_tensors``).
        got = {t.name: tuple(t.shape) for t in self.model.specs}
        if len(self.layouts) != spec.architecture.fragment_count:
            raise TrainerProcessError(f"the node's getRun has {len(self.layouts)} fragment layouts; the spec has "
                                      f"{spec.architecture.fragment_count} fragments (nothing staked)")
        problem = compute_shape_mismatch(got, want)
        if problem is not None:
            raise TrainerProcessError(
                f"the node's fragment layouts do not describe the spec's model (nothing staked): {problem}")

    async def prepare(self, spec: Any) -> Any:
        """The model and inner-loop configs, the payload dtype and the dataset (hash-checked) of
        ``spec``; TrainerProcessError when this trainer cannot train it. Returns the corpus."""
        from tenzro_training.trainer.data import check_shardable, load_corpus, validate_dataset_hash
        from tenzro_training.trainer.inner import PAYLOAD_DTYPES, InnerConfig
        from tenzro_training.trainer.model import get_adapter

        try:
            self.model_cfg = get_adapter(spec.architecture.family).config_from_spec(spec)
            self.inner_cfg = InnerConfig.from_spec(spec, batch_size=self.cfg.batch_size)
            self.payload_dtype = PAYLOAD_DTYPES[spec.architecture.dtype]
            self.encoding = PayloadEncoding.of_run(spec)
            corpus = await asyncio.to_thread(load_corpus, spec.dataset_ref)
            validate_dataset_hash(corpus, spec.dataset_hash)
            # The shard index comes only with enrollment, but whether the corpus fills the M
            # shards at this context and horizon does not depend on it: a corpus too short for
            # the spec's windows is found here, before any stake is bonded (ML review).
            check_shardable(corpus, spec.trainer_count, self.model_cfg.context_len, self.model_cfg.horizon)
        except (TenzroError, KeyError, ValueError) as exc:
            raise TrainerProcessError(f"cannot train {self.cfg.task_id} (nothing staked): {exc}") from None
        return corpus

    async def get_payloads(self, round_: int, view: dict[str, Any]) -> tuple[list[bytes], bool]:
        """This round's payloads and whether they are the ones saved before a restart (never
        recomputed then: the bytes could differ, which is equivocation); else they are trained
        now and saved BEFORE they are first published. ``view``: getRun's answer for the round
        (a restarted topk or q8 trainer resumes its error feedback from it)."""
        base = self.held_hash
        if base is None:
            raise TrainerProcessError("internal: no verified global model to train from")
        saved = self.payloads.load(round_, len(self.layouts), base)
        guard = self.signing_guard()
        for f, payload in enumerate(saved):
            if payload is None and guard.signed(round_, f):
                # Signed before (or maybe, before the record began), and those bytes are not saved
                # for the model held now: the node serves this round again with another model or
                # after it moved on, or the save was lost. Training it again would sign a second
                # payload: equivocation (trainer probe, 2026-11-26).
                if round_ < guard.floor:
                    why = (f"its record of signatures began at round {guard.floor} (created while enrolled: "
                           "earlier rounds may have been signed from another state directory)")
                else:
                    why = ("it signed one before and does not hold it for the model it now trains from "
                           f"({_hex(base)}): the node served this round again with another model or after it "
                           "moved on, or the saved payload was lost")
                raise SigningRefused(f"round {round_} fragment {f}: this trainer may already have signed a "
                                     f"payload for it, so it signs none (equivocation burns the stake): {why}")
        resubmitting = all(p is not None for p in saved)
        if self.encoding.has_feedback and self.feedback is None:
            self.resume_feedback(round_, view, resubmitting=resubmitting)
        if resubmitting:
            return [p for p in saved if p is not None], True
        fresh = await asyncio.to_thread(self.train, round_)
        out = []
        for f, (old, new) in enumerate(zip(saved, fresh, strict=True)):
            # A partial save (the trainer stopped while saving) was never signed, so never
            # published (every fragment of a round is recorded in the guard before any is signed):
            # it is replaced, and the round's fragments all come from one inner loop. Kept, they
            # mixed two, and with carried moments the two differ by design (review, 2026-11-26).
            # A payload the guard says may have been signed keeps its bytes.
            keep = old is not None and guard.signed(round_, f)
            if not keep:
                self.payloads.save(round_, f, base, new)
            out.append(old if keep and old is not None else new)
        return out, False

    async def _rounds(self, stop: asyncio.Event, corpus: Any) -> int:
        from tenzro_training.trainer.data import shard_windows
        from tenzro_training.trainer.inner import InnerLoopDiverged, InnerLoopStopped

        view = await self.wait_training(stop)
        me = next((t for t in view["trainers"] if t["address"].lower() == self.address.lower()), None)
        if me is None:
            raise TrainerProcessError(f"this trainer is not enrolled in {self.cfg.task_id} ({view['status']})")
        self.shard_index = int(me["shard"])
        try:
            self.shard = shard_windows(corpus, self.shard_index, int(view["trainer_count"]),
                                       self.model_cfg.context_len, self.model_cfg.horizon)
        except TrainerError as exc:
            raise TrainerProcessError(f"cannot build shard {self.shard_index}: {exc}") from None
        trained = 0
        refused: set[int] = set()
        """Rounds the signing guard refused (each said once)."""
        progress = time.monotonic()
        """When a round was last accepted (or the loop began): refusals alone end after max_round_wait_s."""
        while not stop.is_set():
            if view["status"] == "Sealed":
                self.payloads.prune(None)
                self.feedback_store.prune(None)
                return await self.finish(view, stop)
            if view["status"] != "Training":
                self.payloads.prune(None)  # nothing can be submitted any more
                self.feedback_store.prune(None)
                raise TrainerProcessError(f"the run ended: {view['status']} ({view.get('end_reason')})")
            if any(t["slashed"] for t in view["trainers"] if t["address"].lower() == self.address.lower()):
                raise TrainerProcessError("this trainer was slashed")
            r = int(view["round"])
            # Only rounds the view commits a record of are over: one getRun claiming a later round
            # pruned the saved bytes of a round still open (trainer probe, 2026-11-26).
            self.payloads.prune(min(r, len(view.get("round_records") or [])))
            if self.held_hash != _unhex(view["model_hash"]):
                view = await self.request_model(view, stop)
                continue  # from the view whose model it holds: the run may have moved on or ended
            self.inbox.expect_finalized(r)  # its RoundFinalized may come while we still submit
            started = time.monotonic()
            try:
                if r >= self.max_rounds:  # the spec (hash-checked) has no such round
                    raise SigningRefused(f"the node says round {r}, but the run's spec has {self.max_rounds} rounds")
                payloads, resubmitted = await self.get_payloads(r, view)
                self.feedback_store.prune(r)  # round r's state (or none) is what a restart needs now
                accepted = await self.submit(r, payloads, stop)
            except InnerLoopStopped:
                return 0  # told to stop mid-round: nothing of the round was saved or published
            except InnerLoopDiverged as exc:
                raise TrainerProcessError(_describe_divergence(r, self.held_hash, exc)) from None
            except SigningRefused as exc:
                # Nothing is signed for this round; the trainer goes on with the next one
                # (exiting made a supervisor restart it into the same refusal until the round
                # closed). Said once per round, paced, and bounded: a node serving refused
                # rounds back to back made it spin (review).
                if r not in refused:
                    refused.add(r)
                    self.say(f"round {r} refused by the signing guard: {exc}")
                if time.monotonic() - progress > self.cfg.max_round_wait_s:
                    raise TrainerProcessError(f"no round could be signed for --max-round-wait "
                                              f"{self.cfg.max_round_wait_s:g}s: the signing guard refused "
                                              f"rounds {sorted(refused)[:10]}") from None
                await asyncio.sleep(self.cfg.poll_interval_s)
                accepted, resubmitted = False, False
                trained -= 1  # not a round trained, for --rounds
            trained += 1
            if accepted:
                progress = time.monotonic()
                self.feedback_round = None  # aggregated: nothing of it may come back
            if accepted:
                how = "saved before a restart" if resubmitted else f"train loss {self.last_loss:.4f}"
                self.say(f"round {r} submitted {len(payloads)} fragments over gossip "
                         f"({how}, {sum(map(len, payloads))} bytes, {time.monotonic() - started:.1f}s)")
                view = await self.wait_finalized(r, stop)
            else:
                # Skipped (late, or the round moved on): go on with the run's current round; if r
                # is still open, it closes without this trainer and its RoundFinalized brings the model.
                view = await self.get_run()
                if view["status"] == "Training" and int(view["round"]) == r:
                    view = await self.wait_finalized(r, stop)
            if self.cfg.rounds is not None and trained >= self.cfg.rounds:
                self.say(f"stopping after {trained} rounds as asked")
                return 0
        return 0

    async def finish(self, view: dict[str, Any], stop: asyncio.Event) -> int:
        final = _unhex(view["final_record"]["final_model_hash"]) if view.get("final_record") else None
        if final is None:
            raise TrainerProcessError("the run is Sealed without a final record")
        if self.held_hash != final:
            # Missed the last RoundFinalized, or joined after the end: fetch the final model.
            await self.request_model(view, stop)  # a sealed run's model never changes
        if self.held_hash != final:
            raise TrainerProcessError(f"final model {_hex(self.held_hash or b'')} differs from {_hex(final)}")
        self.say(f"sealed final model {_hex(final)} verified")
        return 0


def _describe_divergence(round_: int, model_hash: bytes | None, exc: Any) -> str:
    """The line a trainer stops with when its inner loop's loss is not finite. At step 0 the loss
    is the global model's own, before this trainer changed anything: the run's model is broken,
    not this trainer's round, and every trainer of the run stops the same way (Byzantine probe,
    2026-11-27: one Mean trainer's +1e6 outer gradient, within the node's default bound, moved the
    weights by 2.7e5 and all five trainers stopped with only "inner step 0: loss is nan")."""
    model = "the global model" if model_hash is None else f"the global model {_hex(model_hash)}"
    committed = "at the run's start" if round_ == 0 else f"by round {round_ - 1}"
    if exc.step == 0:
        return (f"round {round_}: {model} (committed {committed}) gives a non-finite loss ({exc.loss}) before "
                "any inner step: the run's model has diverged, there is nothing to train on (an outer "
                "gradient under an aggregation rule without Byzantine tolerance, such as Mean, can do this: "
                "docs/aggregation.md); nothing was signed for this round")
    return (f"round {round_}: the inner loop diverged at inner step {exc.step} (loss {exc.loss}) from {model}: "
            "its weights are not submitted; nothing was signed for this round")


def _model_target(view: dict[str, Any]) -> tuple[int, bytes]:
    """The (round, model_hash) a getRun view commits: what the node answers a ModelRequest with."""
    return int(view["round"]), _unhex(view["model_hash"])


def _trainer_validator(topic: str, get_view: Callable[[], TrainerGossipView | None],
                       seen: SeenCache | None = None, *,
                       model_sources: frozenset[str] | None = None) -> Callable[[bytes, str], None]:
    """A trainer's topic validator: ``gossip_trainer.validate_gossip_as_trainer`` against the
    latest view of the run (runs on the p2p thread, which owns ``seen``), taking weights only
    from ``model_sources`` (the peer ids of its ``--bootstrap`` node)."""
    if seen is None:
        seen = SeenCache()

    def validate(data: bytes, from_peer: str) -> None:
        validate_gossip_as_trainer(topic, data, get_view(), seen, origin=from_peer, model_sources=model_sources)

    return validate


async def run_trainer(cfg: TrainerProcessConfig, *, announce: Callable[[str], None] = print) -> int:
    """Run until Sealed, ``cfg.rounds`` rounds, or SIGINT/SIGTERM (returns 0 in all three)."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    trainer = _Trainer(cfg, announce)
    main = asyncio.create_task(trainer.run(stop))
    stopper = asyncio.create_task(stop.wait())
    try:
        await asyncio.wait({main, stopper}, return_when=asyncio.FIRST_COMPLETED)
        if main.done():
            return main.result()
        announce("stopping (signal)")
        trainer.stopping.set()  # the inner loop's thread ends before its next step
        main.cancel()
        try:
            await main
        except asyncio.CancelledError:
            pass
        return 0
    finally:
        stopper.cancel()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)


def run_trainer_from_args(args: argparse.Namespace) -> None:
    """``tenzro trainer run``: exit 0 when done or stopped; CliError otherwise."""
    from tenzro_training.cli.exits import EXIT_RPC_ERROR, EXIT_USAGE, CliError
    from tenzro_training.cli.keys import load_signing_key
    from tenzro_training.cli.values import parse_amount

    level = os.environ.get("TENZRO_LOG_LEVEL", "INFO").strip().upper()
    if level not in LOG_LEVELS:
        raise CliError(f"TENZRO_LOG_LEVEL={os.environ['TENZRO_LOG_LEVEL']!r} is not a log level "
                       f"(one of {', '.join(LOG_LEVELS)})", EXIT_USAGE)
    fmt = os.environ.get("TENZRO_LOG_FORMAT", "text").strip().lower()
    if fmt not in LOG_FORMATS:
        raise CliError(f"TENZRO_LOG_FORMAT={os.environ['TENZRO_LOG_FORMAT']!r} is not a log format "
                       f"(one of {', '.join(LOG_FORMATS)})", EXIT_USAGE)
    configure_logging(level, fmt)
    cfg = TrainerProcessConfig(
        task_id=args.task_id, rpc_url=args.rpc, private_key=load_signing_key(args),
        spec_path=None if args.spec is None else Path(args.spec),
        p2p_key=Path(args.p2p_key), bootstrap=tuple(args.bootstrap or ()),
        listen=tuple(args.p2p_listen or ("/ip4/127.0.0.1/tcp/0",)), chain_id=args.chain_id, rounds=args.rounds,
        did=args.did, stake=parse_amount(args.stake, "--stake"), device=args.device, batch_size=args.batch_size,
        carry_optimizer_state=args.carry_optimizer_state,
        max_round_wait_s=args.max_round_wait, state_dir=None if args.state_dir is None else Path(args.state_dir),
    )
    try:
        asyncio.run(run_trainer(cfg, announce=lambda line: print(f"{time.strftime('%H:%M:%S')} {line}", flush=True)))
    except TrainerError as exc:  # every trainer failure, setup ones included: exit 1 (docs/trainer-process.md)
        raise CliError(str(exc), EXIT_RPC_ERROR) from None
    print(format_stderr_line("trainer stopped", logging.INFO), file=sys.stderr, flush=True)
