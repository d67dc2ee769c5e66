"""What a node does with its store when it starts, before it serves anything (a SHELL helper of
the node service: it reads and writes the store).

What this module is: the checks that bind a store to the node's config (genesis, chain id:
:func:`open_ledger`), the reading of its runs (:func:`load_runs`, every open run's state and
open round checked), the schema mark (:func:`mark_schema_upgraded`), the one-time migrations of
stores written by older versions (``compute_legacy_*_ops``), and the pruning an archive store's
ended runs get once ``prune_payloads`` is switched on (:func:`prune_ended_runs`).

Why it is apart from the service: each of these runs once, at ``NodeService`` construction, on
the store and the config alone, and each is a refusal or a migration with its own history
(the probes and reviews in the docstrings); none of it is needed to read how a call is served.
The service calls them in order and keeps what they return; the order, and where the schema
mark goes in it, is the service's (``NodeService.__init__``).

What it is NOT: the stored encodings (:mod:`.persistence`, :mod:`.model_state`), the audit of a
whole store (:mod:`.audit`), or a reader for offline tools (:mod:`.run_store`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from storage import schema
from storage.interface import BatchOp, KVStore, Operation, StorageError
from tenzro_training.addresses import format_address
from tenzro_training.auth import SubmitOuterGradient, recover_signer_address
from tenzro_training.errors import TenzroError
from tenzro_training.ledger import Ledger, credit
from tenzro_training.node import persistence
from tenzro_training.node.config import NodeConfig
from tenzro_training.node.model_state import compute_prune_ops, decode_round_count, encode_round_count
from tenzro_training.node.replay import check_open_round
from tenzro_training.node.run_store import read_round_records
from tenzro_training.run_state import RunState, RunStatus, is_terminal

__all__ = [
    "check_bound_to",
    "check_stored_signatures_chain",
    "check_submission_chain",
    "compute_legacy_sealed_record_ops",
    "compute_legacy_snapshot_ops",
    "load_finalize_signatures",
    "load_runs",
    "mark_schema_upgraded",
    "open_ledger",
    "prune_ended_runs",
]

log = logging.getLogger("tenzro.node")

Write = Callable[[Sequence[Operation]], None]
"""The node service's one atomic batch write (``NodeService._write``, which records a failed
write for the health check)."""


def mark_schema_upgraded(store: KVStore) -> None:
    older = store.upgrade_schema_version()
    if older is not None:
        log.warning("store upgraded from schema version %d to %d: older versions of tenzro-training can no "
                    "longer open it (docs/node.md \"Upgrading\")", older, schema.SCHEMA_VERSION)


# --- genesis and chain id ---------------------------------------------------------------------


def open_ledger(store: KVStore, config: NodeConfig, write: Write) -> Ledger:
    """The store's ledger, once the store is checked to be bound to ``config``'s genesis and chain
    id (:func:`check_bound_to`); a new store gets ``config``'s genesis and chain id written."""
    ledger = persistence.load_ledger_entries(
        store.iterate(schema.CF_ACCOUNTS), store.iterate(schema.CF_LEDGER)
    )
    flag = store.get(schema.CF_META, schema.NODE_GENESIS_KEY)
    if flag is not None:
        if ledger is None:
            raise StorageError("the genesis record exists but the ledger's supply counters do not")
        check_bound_to(store, config, flag, write)
        return ledger
    if ledger is not None or any(True for _ in store.iterate(schema.CF_TRAINING_RUNS)):
        raise StorageError("the store holds ledger entries or runs but no genesis record: it is damaged")
    ledger = Ledger()
    for address, amount in config.genesis:
        ledger = credit(ledger, address, amount)
    write([*persistence.compute_genesis_ops(ledger, persistence.encode_genesis_record(config.genesis)),
           (BatchOp.PUT, schema.CF_META, schema.NODE_CHAIN_ID_KEY, persistence.encode_chain_id(config.chain_id))])
    return ledger


def check_bound_to(store: KVStore, config: NodeConfig, genesis_record: bytes, write: Write) -> None:
    """Refuse a config whose genesis or chain id is not the store's, and record the chain id
    of a store from before it was recorded. Refused, not ignored (ops probe): a first start
    that failed after creating the store (a port in use) had fixed its genesis for good and
    the corrected config ran on the old balances with a warning; a changed chain id was
    taken silently and every stored signature stopped verifying. Like a chain client's
    genesis mismatch. An empty configured genesis means "whatever the store has"; the
    order of the configured accounts does not matter."""
    stored_genesis = persistence.decode_genesis_record(genesis_record)
    if config.genesis and sorted(config.genesis) != stored_genesis:
        first = ", ".join(f"{format_address(a)}={b}" for a, b in stored_genesis[:2])
        raise StorageError(
            f"the configured genesis differs from the one this store was created with ({len(stored_genesis)} "
            f"account(s): {first}{', ...' if len(stored_genesis) > 2 else ''}): configure that genesis (or "
            f"none: `genesis` absent or empty), or start on a new data dir")
    stored = store.get(schema.CF_META, schema.NODE_CHAIN_ID_KEY)
    if stored is None:  # a store from before the chain id was recorded: record it now
        check_stored_signatures_chain(store, config.chain_id)
        write([(BatchOp.PUT, schema.CF_META, schema.NODE_CHAIN_ID_KEY, persistence.encode_chain_id(config.chain_id))])
        return
    chain_id = persistence.decode_chain_id(stored)
    if chain_id != config.chain_id:
        raise StorageError(
            f"this store was created for chain id {chain_id} and every signature in it was checked under it, "
            f"but the config says {config.chain_id}: set `chain_id` to {chain_id}, or start on a new "
            f"data dir")


def check_stored_signatures_chain(store: KVStore, chain_id: int) -> None:
    """Before a store from before the chain id was recorded is bound to the configured one:
    each run's first stored trainer signature must recover to its trainer under that chain
    id. The binding is for good, and a wrong chain id (the operator of a custom chain
    forgetting --config once) had been recorded as it was: every receipt of the store then
    failed verification, and the right config was refused with a message saying the store
    was made for the wrong one (upgrade probe). A store holding no signature binds as it is."""
    for run_key in store.keys(schema.CF_TRAINING_RUNS):
        # The first submission of each run: a chain id changed between two of its runs (a
        # misconfigured restart before the binding existed) is found too (review).
        task_id = schema.parse_run_key(run_key)
        for key, raw in store.iterate(schema.CF_SUBMISSIONS, schema.task_prefix(task_id)):
            check_submission_chain(key, raw, chain_id)
            break


def check_submission_chain(key: bytes, raw: bytes, chain_id: int) -> None:
    """The stored submission record ``raw`` (under ``key``) must recover to its trainer under
    ``chain_id`` (StorageError otherwise: see :func:`check_stored_signatures_chain`)."""
    sub = schema.parse_submission_key(key)
    record = persistence.decode_submission_record(raw)
    msg = SubmitOuterGradient(task_id=sub.task_id, round=sub.round, fragment=sub.fragment,
                              payload_hash=record.payload_hash)
    try:
        signer: bytes | None = recover_signer_address(msg, record.signature, chain_id)
    except TenzroError:
        signer = None
    if signer != sub.trainer:
        raise StorageError(
            f"the config says chain id {chain_id}, but the signatures this store holds were "
            f"made under another one (trainer {format_address(sub.trainer)}'s submission to "
            f"{sub.task_id} round {sub.round} does not verify under it): set `chain_id` to the one the "
            f"store was run with. Nothing was written; the chain id is recorded at the first start "
            f"whose config verifies")


# --- runs ---------------------------------------------------------------------------------


def load_runs(
    store: KVStore,
) -> tuple[dict[str, RunState], dict[str, persistence.StoredRun], dict[str, dict[str, Any]]]:
    """``(runs, stored, ended)``: every run without a stored summary (``schema.ended_summary_key``),
    decoded, its open round checked, with what the store holds of it; and the listRuns entry of
    every run with one (an ended run, decoded only when a call names it: ``NodeService._lookup``).
    StorageError, naming the run, on a damaged store."""
    runs: dict[str, RunState] = {}
    stored_runs: dict[str, persistence.StoredRun] = {}
    ended: dict[str, dict[str, Any]] = {}
    for key, raw in store.iterate(schema.CF_TRAINING_RUNS):
        task_id = schema.parse_run_key(key)
        summary = store.get(schema.CF_META, schema.ended_summary_key(task_id))
        if summary is not None:  # ended: decoded only when a call names it (_lookup)
            entry = persistence.decode_ended_summary(summary, task_id)
            try:
                status = persistence.read_run_status(raw)
            except StorageError as exc:
                # Unreadable, it may be an open run's: refused, but named (soak probe: "stored
                # run state is not valid JSON" left the operator to search every run).
                raise StorageError(f"the store is damaged: the run {task_id}: {exc}; `tenzro audit` lists "
                                   f"what it finds") from None
            if status != entry["status"]:  # a summary on an open run
                raise StorageError(f"the store is damaged: the summary of {task_id} says {entry['status']}, "
                                   f"its run does not; `tenzro audit` lists what it finds")
            ended[task_id] = entry
            continue
        run = persistence.decode_run(raw, read_round_records(store, task_id))
        if run.task_id != task_id:
            raise StorageError(f"run stored under {task_id!r} is for {run.task_id!r}")
        try:
            check_open_round(store, run)  # what the next finalize will read
        except StorageError as exc:
            raise StorageError(f"the store is damaged: {exc}; restore it from a backup "
                               f"(`tenzro audit` lists what it finds)") from None
        runs[task_id] = run
        stored_runs[task_id] = persistence.stored_run(raw)
    return runs, stored_runs, ended


def load_finalize_signatures(store: KVStore, runs: dict[str, RunState]) -> dict[str, dict[int, bytes]]:
    """task -> round -> the syncer's stored FinalizeRound signature, for the open runs of ``runs``."""
    signatures: dict[str, dict[int, bytes]] = {}
    for task_id, run in sorted(runs.items()):
        if is_terminal(run):
            continue
        for key, raw in store.iterate(schema.CF_META, schema.finalize_signature_prefix(task_id)):
            _, round = schema.parse_finalize_signature_key(key)
            signature = persistence.decode_finalize_record(raw).signature
            signatures.setdefault(task_id, {})[round] = signature
    return signatures


# --- migrations -------------------------------------------------------------------------------


def compute_legacy_snapshot_ops(store: KVStore, runs: dict[str, RunState]) -> list[Operation]:
    """A store of schema version 1 kept every run's current weights and momentum and has no
    snapshot records: record each open run's snapshot at its current round, before any
    finalize writes a round without writing the state (which would make it stale)."""
    ops: list[Operation] = []
    for task_id, run in sorted(runs.items()):
        key = schema.model_snapshot_key(task_id)
        if not is_terminal(run) and not store.contains(schema.CF_META, key):
            ops.append((BatchOp.PUT, schema.CF_META, key, encode_round_count(len(run.records))))
    if ops:
        log.info("recording model snapshots of %d run(s) from a schema-1 store", len(ops))
    return ops


def compute_legacy_sealed_record_ops(store: KVStore, runs: dict[str, RunState]) -> list[Operation]:
    """A store of schema version 1 or 2 has no sealed records (TRAINING_VERIFY's lookup):
    write each sealed run's from its stored receipt, once, before anything can ask for it."""
    ops: list[Operation] = []
    for task_id, run in sorted(runs.items()):
        key = schema.sealed_record_key(task_id)
        if run.status is not RunStatus.SEALED or store.contains(schema.CF_META, key):
            continue
        raw = store.get(schema.CF_TRAINING_RECEIPTS, schema.receipt_key(task_id))
        if raw is None:
            raise StorageError(f"the sealed run {task_id} has no stored receipt: the store is damaged")
        record = persistence.encode_sealed_record(persistence.decode_receipt(raw))
        ops.append((BatchOp.PUT, schema.CF_META, key, record))
    if ops:
        log.info("recording the sealed records of %d run(s) from an older store", len(ops))
    return ops


def prune_ended_runs(store: KVStore, config: NodeConfig, runs: dict[str, RunState], ended: dict[str, Any],
                     write: Write) -> int:
    """With ``prune_payloads`` turned on for a store that kept its payloads (an archive node
    until now), runs that had already ended get the pruning their end would have done:
    nothing else ever deletes their payloads (ops probe: switching it on freed nothing).
    Open runs are pruned at their next snapshot, as always. One batch per run. ``runs``: the
    decoded runs (the ended among them are pruned), ``ended``: the runs known by their summary.
    Returns how many payloads were deleted."""
    if not config.prune_payloads:
        return 0
    pruned = 0
    for task_id in sorted([t for t, run in runs.items() if is_terminal(run)] + list(ended)):
        raw = store.get(schema.CF_META, schema.payloads_pruned_key(task_id))
        if raw is not None and decode_round_count(raw) == schema.PAYLOADS_PRUNED_ALL:
            continue
        ops = compute_prune_ops(store, task_id, schema.PAYLOADS_PRUNED_ALL)
        write(ops)
        pruned += len(ops) - 1
        log.info("pruned the %d stored payload(s) of %s, which ended before prune_payloads was on",
                 len(ops) - 1, task_id)
    return pruned
