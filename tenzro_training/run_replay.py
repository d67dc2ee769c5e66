"""A sealed run recomputed by a third party from its receipt and its downloaded inputs: the checks
of ``tenzro train verify-run`` (docs/cli.md).

What this module is: :func:`verify_run`, which takes a getReceipt document and the run's
sources (:class:`RunSources`: getRun's view, the init checkpoint, every accepted payload, the
final model file, each a callable) and returns one named :class:`~.receipt_check.CheckResult`
per rule, after the receipt's own (:func:`~.receipt_check.check_receipt_document`):

- ``spec``: getRun's spec hashes to the spec the receipt commits (leaf 0 of the run root);
- ``checkpoint``: the init checkpoint's SHA-256 is the spec's, and it parses;
- ``initial_model``: it splits into the spec's fragments; its model hash is the one getRun
  states (the receipt commits no initial model hash: the spec's checkpoint SHA-256 binds it);
- ``payloads``: every payload of every committed round's accepted trainers hashes to the payload
  hash its trainer signed (the attestations, signature-checked by ``submission_signatures``), so
  the node cannot substitute one;
- ``rounds``: every round replayed with the node's own pure round update
  (:func:`~.global_model.compute_round_update`, :func:`~.global_model.check_round_update`)
  reproduces its record: aggregate hashes, accepted, Krum's selection, the trim, the report
  hashes and the model hash;
- ``final_model_hash``: the replayed model hashes to the receipt's final model hash;
- ``model_file``: the node's final model file is byte for byte the file of the replayed weights.

Why: the receipt and its signatures show WHO did what, not that the committed aggregates and
model hashes follow from the inputs; a node could commit any hash. This recomputes them from
nothing the node vouches for: every input is checked against a hash the receipt or a signature
commits before it is used.

What it is NOT: I/O. The sources are callables the caller injects (HTTP in the CLI, fakes in
tests); a source raises :class:`~.errors.ArtifactUnavailable` for an artifact it cannot give (a
failed check), anything else (a transport failure) propagates. Nor a parser of untrusted
checkpoints: ``RunSources.parse_checkpoint`` is the node's own (``node.checkpoint``, a shell).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import cast

import torch

from tenzro_training.addresses import Address, format_address
from tenzro_training.errors import ArtifactUnavailable, EncodingError, TenzroError
from tenzro_training.global_model import (
    InitialModel,
    RecordMismatch,
    RoundBuffers,
    check_round_update,
    compute_final_model_file_bytes,
    compute_initial_model,
    compute_round_update,
    compute_state_model_hash,
)
from tenzro_training.jsonfields import decode_hex
from tenzro_training.payload import compute_max_payload_bytes, compute_payload_hash
from tenzro_training.receipt import TrainingReceipt
from tenzro_training.receipt_check import Attestations, CheckResult, check_receipt_document
from tenzro_training.records import FragmentOutcome, RoundRecord
from tenzro_training.spec import TrainingTaskSpec

__all__ = [
    "RUN_CHECK_NAMES",
    "PayloadSource",
    "RoundProgress",
    "RunCheck",
    "RunSources",
    "RunReplay",
    "check_initial_model",
    "check_model_file",
    "check_run_spec",
    "compute_attested_payload_hashes",
    "replay_run",
    "verify_run",
]

RUN_CHECK_NAMES = ("spec", "checkpoint", "initial_model", "payloads", "rounds", "final_model_hash", "model_file")
"""The checks after the receipt's, in the order :func:`verify_run` runs them."""

PayloadSource = Callable[[int, int, Address, int], bytes]
"""(round, fragment, trainer, max_bytes) -> the payload bytes the source holds for that
accepted submission; ArtifactUnavailable when it has none, or more than ``max_bytes``."""

RoundProgress = Callable[[int, int], None]
"""Called with (rounds replayed, rounds committed) after each round: a long run's progress."""

FetchMap = Callable[[Callable[[tuple[int, int, Address, int]], object], Iterable[tuple[int, int, Address, int]]],
                    Iterable[object]]
"""How a round's payloads are fetched: ``map`` (one after another) or an executor's ``map``
(several at once). Either way the results come back in the record's canonical order."""


@dataclass(frozen=True, slots=True)
class RunSources:
    """Where :func:`verify_run` gets what the receipt does not hold; nothing a source returns is
    trusted (each is checked against a committed hash before it is used)."""

    run_view: Callable[[], object]
    """getRun's answer (its ``spec`` and ``initial_model_hash`` are read)."""
    checkpoint: Callable[[int], bytes]
    """The init checkpoint's bytes, given the most it may be."""
    parse_checkpoint: Callable[[bytes], Mapping[str, torch.Tensor]]
    """Checkpoint bytes -> fp32 state (the node's parser: safetensors only, nothing executed);
    raises a TenzroError for a file it refuses."""
    payload: PayloadSource
    """Every accepted payload."""
    model_file: Callable[[int], bytes] | None = None
    """The node's final model file, given its exact expected size; None: not compared."""
    max_checkpoint_bytes: int = 16 << 30
    """The largest checkpoint read (the node's ``max_checkpoint_bytes`` default)."""
    fetch_map: FetchMap = map
    """How each round's payload downloads are run (``payload`` must then be thread-safe): a
    round is M x F requests, each a round trip before its bytes flow, so a verifier far from
    the node spends most of its time waiting unless several are in flight."""


@dataclass(frozen=True, slots=True)
class RunCheck:
    """Every check of one run, in order, and the ones not run (each with why)."""

    checks: tuple[CheckResult, ...]
    """The receipt's checks (``task_id`` first), then :data:`RUN_CHECK_NAMES` as far as they ran."""
    skipped: tuple[CheckResult, ...] = ()
    """Checks not run because one they need failed; ``detail`` says which."""

    @property
    def ok(self) -> bool:
        """True iff at least one check ran, every one passed and none was skipped."""
        return bool(self.checks) and all(c.ok for c in self.checks) and not self.skipped

    @property
    def failed(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.checks if not c.ok)

    def get(self, name: str) -> CheckResult | None:
        return next((c for c in self.checks if c.name == name), None)


@dataclass(frozen=True, slots=True, eq=False)
class RunReplay:
    """The outcome of :func:`replay_run`."""

    payloads: CheckResult
    rounds: CheckResult | None
    """None: not run (the payloads check failed first)."""
    weights: tuple[torch.Tensor, ...] | None
    """The final fragment weights, when every round reproduced its record; else None."""


def _hex(value: bytes) -> str:
    return "0x" + value.hex()


def compute_attested_payload_hashes(attestations: Attestations) -> dict[tuple[int, int, Address], bytes]:
    """(round, fragment, trainer) -> the payload hash the trainer signed, from the attestations
    (whose signatures ``submission_signatures`` checked)."""
    return {(r.round, s.fragment, s.trainer): s.payload_hash for r in attestations.rounds for s in r.submissions}


def check_run_spec(receipt: TrainingReceipt, view: object) -> CheckResult:
    """``spec``: getRun's spec must be the one the receipt commits (same spec hash), so what the
    replay reads of it (rule, outer step, fragments, checkpoint hash) is committed."""
    try:
        if not isinstance(view, Mapping) or "spec" not in view:
            raise EncodingError("getRun's answer has no spec")
        spec = TrainingTaskSpec.from_dict(view["spec"])
    except (TenzroError, ValueError, TypeError) as exc:  # untrusted JSON: any refusal is a failed check
        return CheckResult("spec", False, f"getRun's spec does not parse: {exc}")
    got, want = spec.spec_hash(), receipt.spec.spec_hash()
    if got != want:
        return CheckResult("spec", False, f"getRun's spec hashes to {_hex(got)}, the receipt commits {_hex(want)}")
    return CheckResult("spec", True, f"getRun's spec hashes to the receipt's {_hex(want)}")


def check_initial_model(
    spec: TrainingTaskSpec, state: Mapping[str, torch.Tensor], view: object
) -> tuple[CheckResult, InitialModel | None]:
    """``initial_model``: the checkpoint's fp32 state split into the spec's fragments, and its
    model hash equal to the ``initial_model_hash`` getRun states (a node whose committed state
    started elsewhere says so there; the receipt itself commits no initial hash)."""
    try:
        initial = compute_initial_model(state, spec.architecture.fragment_count)
    except TenzroError as exc:
        return CheckResult("initial_model", False, f"the checkpoint cannot be split: {exc}"), None
    try:
        claimed = decode_hex("getRun initial_model_hash",
                             view.get("initial_model_hash") if isinstance(view, Mapping) else None, 32)
    except EncodingError as exc:
        return CheckResult("initial_model", False, str(exc)), None
    if claimed != initial.model_hash:
        return CheckResult("initial_model", False, f"the checkpoint's model hash is {_hex(initial.model_hash)}, "
                                                   f"getRun says {_hex(claimed)}"), None
    sizes = "+".join(str(lay.numel) for lay in initial.model.layouts)
    return CheckResult("initial_model", True, f"{_hex(initial.model_hash)}, {len(initial.model.layouts)} "
                                              f"fragment(s) of {sizes} values"), initial


def _fetch_round(
    record: RoundRecord, attested: Mapping[tuple[int, int, Address], bytes], initial: InitialModel,
    source: PayloadSource, fetch_map: FetchMap = map,
) -> list[list[tuple[Address, bytes]]]:
    """The round's inputs in the record's canonical order, each checked against its signed
    hash; raises _PayloadFailed naming the first in that order that is missing, refused or
    substituted (the same one however many downloads ran at once)."""
    jobs: list[tuple[int, int, Address, int]] = []
    for layout, outcome in zip(initial.model.layouts, record.fragments):
        for trainer in outcome.accepted:
            if (record.round, layout.index, trainer) not in attested:  # before anything is downloaded
                raise _PayloadFailed(f"{_where(record.round, layout.index, trainer)}: no signed payload hash attested")
            jobs.append((record.round, layout.index, trainer, compute_max_payload_bytes(layout)))

    def fetch(job: tuple[int, int, Address, int]) -> bytes | ArtifactUnavailable:
        try:
            return source(*job)
        except ArtifactUnavailable as exc:  # a verdict on this payload, reported in order below
            return exc

    inputs: list[list[tuple[Address, bytes]]] = [[] for _ in zip(initial.model.layouts, record.fragments)]
    for (round_, fragment, trainer, bound), data in zip(jobs, fetch_map(fetch, jobs), strict=True):
        where, signed = _where(round_, fragment, trainer), attested[(round_, fragment, trainer)]
        if isinstance(data, ArtifactUnavailable):
            raise _PayloadFailed(f"{where}: {data.reason}")
        assert isinstance(data, bytes)
        if len(data) > bound:
            raise _PayloadFailed(f"{where}: {len(data)} bytes, more than a payload of this fragment can be ({bound})")
        digest = compute_payload_hash(data)
        if digest != signed:
            raise _PayloadFailed(f"{where}: the bytes served hash to {_hex(digest)}, the trainer signed {_hex(signed)}")
        inputs[fragment].append((trainer, data))
    return inputs


def _where(round_: int, fragment: int, trainer: Address) -> str:
    return f"round {round_} fragment {fragment} trainer {format_address(trainer)}"


class _PayloadFailed(Exception):
    """The first payload that could not be had or was not the signed one (internal)."""


def _outcome_difference(record: RoundRecord, outcomes: Sequence[FragmentOutcome]) -> str:
    """Which field of which fragment differs first: more use than "fragment outcomes"."""
    for index, (mine, theirs) in enumerate(zip(outcomes, record.fragments)):
        for field in ("aggregate_hash", "accepted", "selected", "trimmed", "report_hash"):
            a, b = getattr(mine, field), getattr(theirs, field)
            if a != b:
                shown = (lambda v: _hex(v) if isinstance(v, bytes) else repr(v))
                return f"fragment {index} {field}: recomputed {shown(a)}, the record has {shown(b)}"
    return f"{len(outcomes)} fragment outcomes recomputed, the record has {len(record.fragments)}"


def replay_run(
    receipt: TrainingReceipt,
    attestations: Attestations,
    initial: InitialModel,
    source: PayloadSource,
    *,
    on_round: RoundProgress | None = None,
    fetch_map: FetchMap = map,
) -> RunReplay:
    """Replay every committed round of ``receipt`` from ``initial``: fetch its accepted payloads
    (``payloads``), recompute it and compare with its record (``rounds``). Stops at the first
    failure (later rounds build on a model it could not reproduce). Inputs are held one round at
    a time, as the node's finalize holds them."""
    spec = receipt.spec
    attested = compute_attested_payload_hashes(attestations)
    weights = [w.clone() for w in initial.weights]
    momentum = [torch.zeros_like(w) for w in weights]
    max_payload = max((compute_max_payload_bytes(lay) for lay in initial.model.layouts), default=0)
    buffers = RoundBuffers()
    fetched = 0
    total = len(receipt.transcript)
    for record in receipt.transcript:
        try:
            inputs = _fetch_round(record, attested, initial, source, fetch_map)
        except _PayloadFailed as exc:
            return RunReplay(CheckResult("payloads", False, str(exc)), None, None)
        fetched += sum(len(subs) for subs in inputs)
        try:
            update = compute_round_update(spec, initial.model, record.round, inputs, weights, momentum,
                                          max_payload_bytes=max_payload, in_place=True, buffers=buffers)
        except TenzroError as exc:  # signed payloads that do not decode or aggregate under the spec
            return RunReplay(_payloads_ok(fetched, record.round + 1, total),
                             CheckResult("rounds", False, f"round {record.round} cannot be recomputed: {exc}"), None)
        try:
            check_round_update(spec.task_id, record, update)
        except RecordMismatch as exc:
            detail = (_outcome_difference(record, update.outcomes) if exc.what == "fragment outcomes"
                      else f"model hash: recomputed {_hex(update.model_hash)}, the record has {_hex(record.model_hash)}")
            return RunReplay(_payloads_ok(fetched, record.round + 1, total),
                             CheckResult("rounds", False, f"round {record.round} {detail}"), None)
        del inputs, update
        if on_round is not None:
            on_round(record.round + 1, total)
    rounds = CheckResult("rounds", True, f"{total} round(s) recomputed: aggregates, outcomes, reports and model "
                                         "hashes equal their records")
    return RunReplay(_payloads_ok(fetched, total, total), rounds, tuple(weights))


def _payloads_ok(fetched: int, rounds: int, total: int) -> CheckResult:
    later = "" if rounds == total else f" (of rounds 0..{rounds - 1}: the replay stopped there)"
    return CheckResult("payloads", True, f"{fetched} accepted payload(s) hash to their signed hashes{later}")


def check_model_file(
    receipt: TrainingReceipt, initial: InitialModel, weights: Sequence[torch.Tensor], source: Callable[[int], bytes]
) -> CheckResult:
    """``model_file``: the node's final model file equals, byte for byte, the file of the replayed
    weights (``global_model.compute_final_model_file_bytes`` with the receipt's run), the exact
    bytes ``export-model`` writes."""
    expected = compute_final_model_file_bytes(receipt.task_id, receipt.final_model_hash, receipt.run_root,
                                              initial.model, weights)
    try:
        data = source(len(expected))
    except ArtifactUnavailable as exc:
        return CheckResult("model_file", False, exc.reason)
    if data != expected:
        return CheckResult("model_file", False, f"the node's file ({len(data)} bytes, SHA-256 "
                                                f"{_hex(hashlib.sha256(data).digest())}) is not the replayed model's "
                                                f"({len(expected)} bytes, {_hex(hashlib.sha256(expected).digest())})")
    return CheckResult("model_file", True, f"{len(data)} bytes, byte-identical to the replayed model's file")


def _skip(names: Sequence[str], why: str) -> tuple[CheckResult, ...]:
    return tuple(CheckResult(name, False, why) for name in names)


def verify_run(
    document: object,
    sources: RunSources,
    *,
    chain_id: int | None = None,
    task_id: str | None = None,
    on_round: RoundProgress | None = None,
) -> RunCheck:
    """Every check of the module docstring, in order. Never raises for what it finds; a
    source's error other than ArtifactUnavailable (a transport failure) propagates."""
    verdict = check_receipt_document(document, chain_id, task_id=task_id)
    checks = list(verdict.checks)
    names = list(RUN_CHECK_NAMES if sources.model_file is not None else RUN_CHECK_NAMES[:-1])

    def stop(at: str, why: str) -> RunCheck:
        return RunCheck(tuple(checks), _skip(names[names.index(at):], why))

    if not verdict.ok:
        return stop("spec", f"not run: the receipt does not verify ({', '.join(verdict.failed)})")
    decoded = cast(Mapping[str, object], document)  # check_receipt_document decoded it as one
    receipt = TrainingReceipt.from_dict(decoded["receipt"])
    attestations = Attestations.from_dict(decoded["attestations"])

    try:
        view: object = sources.run_view()
    except ArtifactUnavailable as exc:
        checks.append(CheckResult("spec", False, f"no getRun answer: {exc.reason}"))
        return stop("checkpoint", "not run: the spec check failed")
    checks.append(check_run_spec(receipt, view))
    if not checks[-1].ok:
        return stop("checkpoint", "not run: the spec check failed")

    checkpoint = _check_checkpoint(receipt.spec, sources)
    checks.append(checkpoint[0])
    if checkpoint[1] is None:
        return stop("initial_model", "not run: the checkpoint check failed")
    result, initial = check_initial_model(receipt.spec, checkpoint[1], view)
    del checkpoint
    checks.append(result)
    if initial is None:
        return stop("payloads", "not run: the initial_model check failed")

    replay = replay_run(receipt, attestations, initial, sources.payload, on_round=on_round,
                        fetch_map=sources.fetch_map)
    checks.append(replay.payloads)
    if replay.rounds is None:
        return stop("rounds", "not run: the payloads check failed")
    checks.append(replay.rounds)
    if replay.weights is None:
        return stop("final_model_hash", "not run: the rounds check failed")
    final = compute_state_model_hash(initial.model, replay.weights)
    same = final == receipt.final_model_hash
    checks.append(CheckResult("final_model_hash", same, f"the replayed model hashes to the receipt's {_hex(final)}" if same
                              else f"the replayed model hashes to {_hex(final)}, the receipt says "
                                   f"{_hex(receipt.final_model_hash)}"))
    if sources.model_file is not None:
        if not same:
            return stop("model_file", "not run: the final_model_hash check failed")
        checks.append(check_model_file(receipt, initial, replay.weights, sources.model_file))
    return RunCheck(tuple(checks))


def _check_checkpoint(
    spec: TrainingTaskSpec, sources: RunSources
) -> tuple[CheckResult, Mapping[str, torch.Tensor] | None]:
    """``checkpoint``: the bytes hash to the spec's SHA-256 and the node's parser accepts them."""
    ref = spec.init_checkpoint()
    if ref is None:
        return CheckResult("checkpoint", False, "the spec names no architecture.metadata.init_checkpoint"), None
    try:
        data = sources.checkpoint(sources.max_checkpoint_bytes)
    except ArtifactUnavailable as exc:
        return CheckResult("checkpoint", False, exc.reason), None
    if len(data) > sources.max_checkpoint_bytes:
        return CheckResult("checkpoint", False, f"{len(data)} bytes, more than {sources.max_checkpoint_bytes}"), None
    digest = hashlib.sha256(data).digest()
    if digest != ref.sha256_bytes:
        return CheckResult("checkpoint", False, f"SHA-256 {_hex(digest)}, the spec says {ref.sha256}"), None
    try:
        state = sources.parse_checkpoint(data)
    except TenzroError as exc:
        return CheckResult("checkpoint", False, f"SHA-256 is the spec's but the file is refused: {exc}"), None
    return CheckResult("checkpoint", True, f"{len(data)} bytes, SHA-256 {ref.sha256} (the spec's), "
                                           f"{len(state)} tensor(s)"), state
