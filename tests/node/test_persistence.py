"""Stored value encodings and the transition -> batch operations function."""

from __future__ import annotations

import json

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from storage import schema
from storage.memory import MemoryStore
from storage.interface import BatchOp, StorageError
from tenzro_training.auth import SubmitOuterGradient
from tenzro_training.ledger import Escrow, Ledger, bond_stake, credit, escrow_reward, slash_stake
from tenzro_training.node import persistence
from tenzro_training.global_model import ModelLayout
from tenzro_training.node.model_state import (
    compute_drop_snapshot_ops,
    compute_snapshot_ops,
    decode_fragment,
    decode_model_layout,
    decode_round_count,
    encode_fragment,
    encode_model_layout,
    encode_round_count,
    load_model_fragments,
)
from tenzro_training.fragments import TensorSpec
from tenzro_training.run import process_post_task
from tenzro_training.run_state import RunState

from tests.test_run import INITIAL_MODEL, SPONSOR, TIMINGS, funded_ledger, make_spec

A = b"\x0a" * 20
B = b"\x0b" * 20
amounts = st.integers(min_value=0, max_value=2**256 - 1)


@given(amounts)
def test_u256_round_trip(value: int) -> None:
    raw = persistence.encode_u256(value)
    assert len(raw) == 32 and persistence.decode_u256(raw) == value


@given(amounts, amounts)
def test_escrow_and_supply_round_trip(amount: int, other: int) -> None:
    escrow = Escrow(sponsor=A, amount=amount)
    assert persistence.decode_escrow(persistence.encode_escrow(escrow)) == escrow
    assert persistence.decode_supply(persistence.encode_supply(amount, other)) == (amount, other)


def test_submission_record_round_trip() -> None:
    record = persistence.SubmissionRecord(b"\x01" * 32, b"\x02" * 65)
    raw = persistence.encode_submission_record(record)
    assert raw[0] == 1 and len(raw) == 98
    assert persistence.decode_submission_record(raw) == record


def _evidence(slashed_in_round: int = 3) -> bytes:
    msgs = [SubmitOuterGradient(task_id="run-1", round=1, fragment=0, payload_hash=bytes([v]) * 32) for v in (1, 2)]
    return persistence.encode_evidence(msgs[0], b"\x03" * 65, msgs[1], b"\x04" * 65, A, 1337, slashed_in_round)


def test_evidence_round_trip_and_version_1() -> None:
    att = persistence.decode_evidence(_evidence())
    assert (att.trainer, att.round, att.fragment, att.slashed_in_round) == (A, 1, 0, 3)
    assert att.payload_hashes == (b"\x01" * 32, b"\x02" * 32) and att.signatures == (b"\x03" * 65, b"\x04" * 65)
    # Version 1 (before a slashing could follow a finalized round's evidence): in effect at once.
    old = json.loads(_evidence())
    old["version"] = 1
    del old["slashed_in_round"]
    assert persistence.decode_evidence(json.dumps(old).encode()).slashed_in_round == 1


def _evidence_edited(**changes: object) -> bytes:
    value = json.loads(_evidence())
    value.update(changes)
    return json.dumps(value).encode()


@pytest.mark.parametrize(
    "decode",
    [
        lambda: persistence.decode_evidence(_evidence_edited(version=3)),
        lambda: persistence.decode_evidence(_evidence_edited(slashed_in_round=-1)),
        lambda: persistence.decode_evidence(_evidence_edited(slashed_in_round="3")),
        lambda: persistence.decode_u256(b"\x00" * 31),
        lambda: persistence.decode_escrow(b"\x00" * 51),
        lambda: persistence.decode_supply(b"\x00" * 63),
        lambda: persistence.decode_submission_record(b"\x02" + b"\x00" * 97),
        lambda: persistence.decode_run(b"{not json"),
        lambda: persistence.decode_run(b'{"version": 1}'),
        lambda: persistence.decode_receipt(b"[]"),
        lambda: persistence.decode_json(b"[" * 10_000, "x"),
        lambda: persistence.decode_round_reports(b'{"a": 1}'),
        lambda: decode_fragment(b"\x00" * 7, 2),
        lambda: decode_round_count(b"\x00" * 4),
        lambda: decode_model_layout(b'{"version": 2, "tensors": [["w", [2], "float32"]]}', 1),  # else well-formed
        lambda: decode_model_layout(b'{"version": 1, "tensors": [["a#b", [2], "float32"]]}', 1),
    ],
)
def test_invalid_stored_values_are_storage_errors(decode: object) -> None:
    with pytest.raises(StorageError):
        decode()  # type: ignore[operator]


def test_fragment_bytes_are_little_endian_fp32() -> None:
    flat = torch.tensor([1.0, -2.5, 0.0], dtype=torch.float32)
    raw = encode_fragment(flat)
    assert raw == b"\x00\x00\x80\x3f" + b"\x00\x00\x20\xc0" + b"\x00\x00\x00\x00"
    assert torch.equal(decode_fragment(raw, 3), flat)
    # Anything else would be stored as bytes that decode to another fragment: a caller's bug.
    for wrong in (flat.reshape(3, 1), flat.to(torch.float64)):
        with pytest.raises(ValueError, match="1-D float32"):
            encode_fragment(wrong)


def test_snapshot_record_is_a_big_endian_u64() -> None:
    assert encode_round_count(0) == b"\x00" * 8
    assert encode_round_count(258) == b"\x00" * 6 + b"\x01\x02"
    assert decode_round_count(encode_round_count(2**64 - 1)) == 2**64 - 1


def test_model_layout_round_trip() -> None:
    specs = [TensorSpec("w", (3, 2), "float32"), TensorSpec("b", (4,), "float32"), TensorSpec("e", (0,), "float32")]
    layout = ModelLayout.from_specs(specs, 3)
    again = decode_model_layout(encode_model_layout(layout), 3)
    assert again == layout
    assert [s.name for s in again.specs] == ["b", "e", "w"]
    assert [lay.numel for lay in again.layouts] == [4, 3, 3]


def test_model_layout_reads_the_stored_version_1_form() -> None:
    """Stores written by earlier nodes hold this exact JSON: a change to the stored form (its
    version number included) must come with a schema migration, not make them unreadable."""
    raw = b'{"version": 1, "tensors": [["w", [3, 2], "float32"], ["b", [4], "float32"]]}'
    layout = decode_model_layout(raw, 2)
    assert [(s.name, s.shape) for s in layout.specs] == [("b", (4,)), ("w", (3, 2))]
    assert json.loads(encode_model_layout(layout)) == {
        "version": 1, "tensors": [["b", [4], "float32"], ["w", [3, 2], "float32"]]
    }


def test_dropping_a_snapshot_deletes_everything_its_writing_put() -> None:
    """A round count left behind names weights and momentum that are gone: the next rebuild of
    the run's model would start from a snapshot that is not there."""
    store = MemoryStore()
    layout = ModelLayout.from_specs([TensorSpec("w", (3, 2), "float32"), TensorSpec("b", (4,), "float32")], 2)
    fragments = [torch.ones(fragment.numel) for fragment in layout.layouts]
    for ops in (compute_snapshot_ops("run-1", 2, fragments, fragments), compute_drop_snapshot_ops("run-1", 2)):
        with store.atomic_batch() as batch:
            for op, cf, key, value in ops:
                if op is BatchOp.PUT:
                    batch.put(cf, key, value)
                else:
                    batch.delete(cf, key)
        if ops[-1][0] is BatchOp.PUT:
            loaded = load_model_fragments(store, "run-1", schema.MODEL_MOMENTUM, layout)
            assert all(torch.equal(a, b) for a, b in zip(loaded, fragments, strict=True))
    assert list(store.iterate(schema.CF_MODEL_STATE)) == []
    assert store.get(schema.CF_META, schema.model_snapshot_key("run-1")) is None
    with pytest.raises(StorageError, match="model state b'w' of run-1 fragment 0 is missing"):
        load_model_fragments(store, "run-1", schema.MODEL_WEIGHTS, layout)


def _ledger() -> Ledger:
    ledger = credit(credit(Ledger(), A, 100), B, 50)
    ledger = escrow_reward(ledger, "t", A, 60)
    return bond_stake(ledger, "t", B, 50)


def test_genesis_ops_write_every_balance_supply_and_flag() -> None:
    ledger = credit(credit(Ledger(), A, 100), B, 50)
    ops = persistence.compute_genesis_ops(ledger, b"record")
    puts = {(cf, key): value for op, cf, key, value in ops if op is BatchOp.PUT}
    assert puts[(schema.CF_ACCOUNTS, A)] == persistence.encode_u256(100)
    assert puts[(schema.CF_LEDGER, schema.LEDGER_SUPPLY_KEY)] == persistence.encode_supply(150, 0)
    assert puts[(schema.CF_META, schema.NODE_GENESIS_KEY)] == b"record"
    assert len(ops) == 4
    assert persistence.compute_genesis_ops(Ledger(), b"r")[0][2] == schema.LEDGER_SUPPLY_KEY  # empty genesis


def test_ledger_diff_ops_and_reload() -> None:
    before = _ledger()
    after, burned = slash_stake(before, "t", B)
    assert burned == 50
    ops, _ = persistence.compute_transition_ops(None, _fake_run(), before, after)
    ledger_ops = [op for op in ops if op[1] != schema.CF_TRAINING_RUNS]
    assert ledger_ops == [
        (BatchOp.DELETE, schema.CF_LEDGER, schema.bond_key("t", B), None),
        (BatchOp.PUT, schema.CF_LEDGER, schema.LEDGER_SUPPLY_KEY, persistence.encode_supply(150, 50)),
    ]
    # Writing every entry of a ledger and loading them back gives the ledger.
    accounts = [(schema.account_key(a), persistence.encode_u256(v)) for a, v in after.balances()]
    entries = [(schema.escrow_key("t"), persistence.encode_escrow(after.escrows["t"])),
               (schema.LEDGER_SUPPLY_KEY, persistence.encode_supply(after.minted, after.burned))]
    assert persistence.load_ledger_entries(accounts, entries) == after
    with pytest.raises(StorageError):  # conservation broken: a balance without its supply
        persistence.load_ledger_entries(accounts + [(schema.account_key(b"\x0c" * 20), persistence.encode_u256(1))], entries)
    with pytest.raises(StorageError):
        persistence.load_ledger_entries(accounts, [])
    assert persistence.load_ledger_entries([], []) is None


def _fake_run() -> RunState:
    return process_post_task(make_spec(), SPONSOR, funded_ledger(), 1000, TIMINGS, INITIAL_MODEL).run


def test_unchanged_run_and_ledger_give_no_ops() -> None:
    run = _fake_run()
    ledger = _ledger()
    ops, stored = persistence.compute_transition_ops(None, run, ledger, ledger)
    assert [op[1] for op in ops] == [schema.CF_TRAINING_RUNS] and stored == persistence.StoredRun(persistence.encode_run(run), 0)
    assert persistence.compute_transition_ops(stored, run, ledger, ledger) == ([], stored)
    assert persistence.decode_run(stored.value) == run
    extra = [(BatchOp.PUT, schema.CF_META, b"x", b"y")]
    assert persistence.compute_transition_ops(stored, run, ledger, ledger, extra)[0] == extra


def _runs_through_two_rounds() -> list[RunState]:
    """A run's states from posting through rounds 0 and 1 finalized (tests/test_run.py's Env)."""
    from tests.test_run import GRACE_MS, _round_0_finalized

    env = _round_0_finalized()
    states = [env.run]
    for f in (0, 1):
        env.submit(0, f, 5000)
        env.submit(1, f, 5010)
    states.append(env.run)
    env.finalize(5010 + GRACE_MS + 1)
    states.append(env.run)
    assert [len(s.records) for s in states] == [1, 1, 2]  # type: ignore[union-attr]
    return states  # type: ignore[return-value]


def test_each_round_record_is_written_once_and_the_value_stays_small() -> None:
    """Until schema version 4 the run's value held every round record, and each transition
    rewrote it whole: a run's writes grew with the square of its rounds (soak probe: 1.19 GB of
    log for 600 rounds of a tiny model). Now a record is its own value, written by the
    transition that commits it."""
    ledger = _ledger()
    first, training, second = _runs_through_two_rounds()
    ops, stored = persistence.compute_transition_ops(None, first, ledger, ledger)
    record_key = schema.round_record_key(first.task_id, 0)
    assert [(cf, key) for _, cf, key, _ in ops] == [(schema.CF_TRAINING_RUNS, schema.run_key(first.task_id)),
                                                    (schema.CF_META, record_key)]
    assert ops[1][3] == persistence.encode_round_record(first.records[0]) and stored.record_count == 1
    ops, stored = persistence.compute_transition_ops(stored, training, ledger, ledger)  # a submission
    assert [cf for _, cf, _, _ in ops] == [schema.CF_TRAINING_RUNS]
    ops, stored = persistence.compute_transition_ops(stored, second, ledger, ledger)  # round 1 committed
    assert [key for _, _, key, _ in ops] == [schema.run_key(first.task_id), schema.round_record_key(first.task_id, 1)]
    assert b"records" not in stored.value and b'"record_count":2' in stored.value
    records = [(r.round, persistence.encode_round_record(r)) for r in second.records]
    assert persistence.decode_run(stored.value, records) == second
    assert persistence.stored_run(stored.value) == stored
    with pytest.raises(ValueError, match="records are never removed"):
        persistence.compute_transition_ops(stored, first, ledger, ledger)


def test_a_version_3_run_value_is_read_and_rewritten_whole_by_its_next_transition() -> None:
    """A store from before schema version 4 holds each run's records inline: it is read as it
    is, and the run's next transition writes the value without them and every record under its
    own key, in one batch."""
    ledger = _ledger()
    _, training, second = _runs_through_two_rounds()
    legacy = persistence.encode_json(training.to_dict())  # what version 3 stored
    assert persistence.decode_run(legacy) == training
    stored = persistence.stored_run(legacy)
    assert stored == persistence.StoredRun(legacy, 0)
    ops, after = persistence.compute_transition_ops(stored, second, ledger, ledger)
    assert [key for _, _, key, _ in ops] == [
        schema.run_key(second.task_id), schema.round_record_key(second.task_id, 0), schema.round_record_key(second.task_id, 1),
    ]
    assert after.record_count == 2
    with pytest.raises(StorageError, match="holds its records inline, yet round records are stored"):
        persistence.decode_run(legacy, [(0, persistence.encode_round_record(training.records[0]))])


@pytest.mark.parametrize(("records", "said"), [
    ([], "names 2 round record\\(s\\), the store holds none"),
    ([0], "names 2 round record\\(s\\), the store holds rounds \\[0\\]"),
    ([0, 2], "the store holds rounds \\[0, 2\\]"),
    ([0, 1, 2], "the store holds rounds \\[0, 1, 2\\]"),
])
def test_invalid_round_records_for_a_run_value_are_storage_errors(records: list[int], said: str) -> None:
    _, _, second = _runs_through_two_rounds()
    value = persistence.encode_run(second)
    body = persistence.encode_round_record(second.records[0])
    with pytest.raises(StorageError, match=said):
        persistence.decode_run(value, [(r, body) for r in records])
    with pytest.raises(StorageError, match="round record 1 is not valid JSON"):
        persistence.decode_run(value, [(0, body), (1, b"{")])
    swapped = [(0, persistence.encode_round_record(second.records[1])), (1, body)]
    with pytest.raises(StorageError, match="stored round record 0 of .* is not that round's record"):
        persistence.decode_run(value, swapped)
    with pytest.raises(StorageError, match="record_count -1"):
        persistence.decode_run(value.replace(b'"record_count":2', b'"record_count":-1'))
    for damaged in (10**12, 2**64):  # built a list of that many rounds: out of memory, or OverflowError
        with pytest.raises(StorageError, match=f"names {damaged} round record"):
            persistence.decode_run(value.replace(b'"record_count":2', b'"record_count":%d' % damaged), [(0, body)])


@pytest.mark.parametrize("balance", ["1e400", "Infinity", '"x"', "null"])
def test_invalid_stored_genesis_balance_is_a_storage_error(balance: str) -> None:
    raw = b'{"genesis":[{"address":"0x' + b"11" * 20 + b'","balance":' + balance.encode() + b"}]}"
    with pytest.raises(StorageError, match="genesis record"):
        persistence.decode_genesis_record(raw)


@pytest.mark.parametrize("value", [-1, 2**256, True, 1.0, "1"])
def test_invalid_u256_to_encode_is_a_value_error(value: object) -> None:
    with pytest.raises(ValueError, match="not a uint256"):
        persistence.encode_u256(value)  # type: ignore[arg-type]


def test_chain_id_record_round_trip() -> None:
    for chain_id in (1, 1337, 2**256 - 1):
        assert persistence.decode_chain_id(persistence.encode_chain_id(chain_id)) == chain_id
    with pytest.raises(StorageError, match="stored chain id is malformed"):
        persistence.decode_chain_id(b"\x00" * 8)


def test_sealed_record_is_the_run_root_and_the_receipt_digest() -> None:
    from tenzro_training.receipt import compute_receipt
    from tenzro_training.receipt_abi import compute_receipt_digest, encode_receipt
    from tests.test_receipt import sealed_env

    receipt = compute_receipt(sealed_env().run)
    raw = persistence.encode_sealed_record(receipt)
    assert raw == receipt.run_root + compute_receipt_digest(encode_receipt(receipt))
    assert persistence.decode_sealed_record(raw) == (receipt.run_root, compute_receipt_digest(encode_receipt(receipt)))
    for bad in (raw[:63], raw + b"\x00", None):
        with pytest.raises(StorageError):
            persistence.decode_sealed_record(bad)  # type: ignore[arg-type]


def test_submission_record_version_is_its_first_byte() -> None:
    record = persistence.SubmissionRecord(b"\x07" * 32, b"\x08" * 65)
    assert persistence.decode_submission_record(persistence.encode_submission_record(record)) == record
    with pytest.raises(StorageError):
        persistence.decode_submission_record(b"\x02" + b"\x01" * 97)  # version 2, whatever follows
    for bad in (persistence.SubmissionRecord(b"\x07" * 31, b"\x08" * 65), persistence.SubmissionRecord(b"\x07" * 32, b"\x08" * 64)):
        with pytest.raises(ValueError):
            persistence.encode_submission_record(bad)


def test_finalize_record_round_trip_and_invalid() -> None:
    record = persistence.FinalizeRecord(A, b"\x05" * 65)
    raw = persistence.encode_finalize_record(record)
    assert raw == b"\x01" + A + b"\x05" * 65
    assert persistence.decode_finalize_record(raw) == record
    for bad in (persistence.FinalizeRecord(A[:19], b"\x05" * 65), persistence.FinalizeRecord(A, b"\x05" * 64)):
        with pytest.raises(ValueError):
            persistence.encode_finalize_record(bad)
    for raw_bad in (raw[:85], raw + b"\x00", b"\x02" + raw[1:]):
        with pytest.raises(StorageError):
            persistence.decode_finalize_record(raw_bad)


def test_round_reports_round_trip_and_invalid() -> None:
    docs = [{"fragment": 0, "rule": "mean"}, {"fragment": 1, "rule": "mean"}]
    raw = persistence.encode_round_reports([persistence.compute_report_canonical(d) for d in docs])
    assert persistence.decode_round_reports(raw) == docs
    assert persistence.decode_round_reports(b"[]") == []
    for bad in (b"[1]", b'[{"a": 1}, []]'):
        with pytest.raises(StorageError, match="round reports are malformed"):
            persistence.decode_round_reports(bad)


def test_invalid_stored_balance_is_reported_not_dropped() -> None:
    """A malformed account entry is a damaged store, even when the rest adds up without it."""
    with pytest.raises(StorageError, match="stored balance is malformed"):
        persistence.load_ledger_entries([(schema.account_key(A), b"\x00" * 31)],
                                        [(schema.LEDGER_SUPPLY_KEY, persistence.encode_supply(0, 0))])
    ledger = credit(Ledger(), A, 5)
    entries = [(schema.LEDGER_SUPPLY_KEY, persistence.encode_supply(5, 0))]
    with pytest.raises(StorageError, match="stored balance is malformed"):
        persistence.load_ledger_entries([(schema.account_key(A), persistence.encode_u256(5)[1:])], entries)
    assert persistence.load_ledger_entries([(schema.account_key(A), persistence.encode_u256(5))], entries) == ledger


def test_a_balance_of_zero_is_deleted_and_one_of_one_is_kept() -> None:
    before = credit(credit(Ledger(), A, 100), B, 50)
    after = bond_stake(bond_stake(before, "t", B, 50), "u", A, 99)
    ops, _ = persistence.compute_transition_ops(None, _fake_run(), before, after)
    account_ops = sorted((op[0].name, op[2], op[3]) for op in ops if op[1] == schema.CF_ACCOUNTS)
    assert account_ops == [("DELETE", schema.account_key(B), None), ("PUT", schema.account_key(A), persistence.encode_u256(1))]
