"""TRAINING_VERIFY binds the WHOLE receipt to the one the node sealed, not just its run root.

The run root does not commit a trainer's ``slashed`` flag (nor its stake, DID, or ``sealedAt``),
and the validity rules accept ``slashed=false, weight=count`` as well as ``slashed=true,
weight=0`` for any trainer. These tests replay the reviewer's attacks against a REAL sealed node
run and the real py-evm with the precompile: the forged receipts pass ``verify_receipt_bytes``
(so only the sealed record can catch them), yet the precompile answers 0x00 and the escrow's
claim reverts ``ReceiptNotVerified``, leaving every balance and credit unchanged; afterwards the
honest receipt pays exactly the node's split.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import eth_abi
import pytest
from eth_account import Account
from eth_utils import to_checksum_address

from precompile import INVALID, VALID, SealedReceipt, compute_sealed_receipt, training_verify
from precompile.evm import sealed_lookup_from_store
from tenzro_training.receipt_abi import RECEIPT_ABI_TYPE, _abi_value, compute_receipt_digest, verify_receipt_bytes
from tests.chain.conftest import Chain, SealedRun, run_to_sealed
from tests.chain.test_escrow import AMOUNT, Setup, expected_payouts, make_setup
from tests.node.conftest import SPONSOR

PRECOMPILE = to_checksum_address("0x" + "00" * 18 + "1008")

Row = tuple[bytes, int, int, str, bool]


def forge(run: SealedRun, edit: Callable[[int, Row], Row]) -> bytes:
    """The sealed receipt re-encoded with ``edit(i, row)`` applied to each trainer row
    (canonical address order); everything the run root commits is left as sealed."""
    value = list(_abi_value(run.receipt))
    value[8] = [edit(i, row) for i, row in enumerate(value[8])]
    return eth_abi.encode([RECEIPT_ABI_TYPE], [tuple(value)])


def slash(row: Row) -> Row:
    address, _weight, stake, did, _slashed = row
    return (address, 0, stake, did, True)


def precompile_call(chain: Chain, data: bytes) -> bytes:
    return bytes(chain.w3.eth.call({"to": PRECOMPILE, "data": "0x" + data.hex(), "gas": 30_000_000}))


def assert_refused_everywhere(s: Setup, forged: bytes, claimer_key: bytes) -> None:
    """The forgery is VALID by the rules alone, refused by the precompile (in the EVM and by the
    reference), and its claim reverts ReceiptNotVerified without moving anything."""
    run = s.run
    assert forged != run.abi
    assert verify_receipt_bytes(run.run_root, forged) is not None  # the rules alone accept it
    assert precompile_call(s.chain, run.run_root + forged) == INVALID
    assert training_verify(run.run_root + forged, sealed_lookup_from_store(run.store)) == INVALID
    assert precompile_call(s.chain, run.run_root + run.abi) == VALID  # positive control
    before, owed = s.balances(), s.owed()
    assert s.claim(forged, run.run_root, key=claimer_key).status == 0
    assert s.revert_name(s.escrow.functions.claim(forged, run.run_root), claimer_key) == "ReceiptNotVerified"
    assert s.balances() == before and s.owed() == owed


def assert_honest_claim_pays_the_node_split(s: Setup) -> None:
    run = s.run
    before = s.balances()
    assert s.settle(run.abi, run.run_root).status == 1
    after = s.balances()
    pay, dust = expected_payouts(run, AMOUNT)
    assert {name: after[name] - before[name] for name in pay} == pay
    assert after["sponsor"] - before["sponsor"] == dust
    assert after["escrow"] == 0


@pytest.fixture
def funded(chain: Chain, sealed_run: SealedRun) -> Setup:
    s = make_setup(chain, sealed_run)
    assert s.deposit(sealed_run.task_id).status == 1
    return s


def test_invalid_all_slashed_forgery_by_the_sponsor(funded: Setup) -> None:
    # Every trainer marked slashed: totalWeight 0, so the whole deposit would go back as dust.
    forged = forge(funded.run, lambda i, row: slash(row))
    assert_refused_everywhere(funded, forged, SPONSOR.key)
    assert_honest_claim_pays_the_node_split(funded)


def test_invalid_one_trainer_marks_the_others_slashed(funded: Setup) -> None:
    run = funded.run
    # The trainer with weight 2 (it skipped round 1) marks the two weight-4 trainers slashed.
    rows = _abi_value(run.receipt)[8]
    thief = next(row[0] for row in rows if row[1] == 2)
    assert sorted(row[1] for row in rows) == [2, 4, 4]
    forged = forge(run, lambda i, row: row if row[0] == thief else slash(row))
    thief_key = next(t.key for t in run.trainers if t.address == thief)
    funded.chain.fund(Account.from_key(thief_key).address)
    assert_refused_everywhere(funded, forged, thief_key)
    assert_honest_claim_pays_the_node_split(funded)


def test_invalid_unslashing_a_slashed_trainer(chain: Chain, tmp_path: Path) -> None:
    # Trainer 0 submits in round 0 (accepted) and equivocates in round 1 (slashed): its count
    # in the transcript is 2, so "slashed=false, weight=2" satisfies the weight rule too.
    run = run_to_sealed(tmp_path, task_id="unslash-run", equivocate=0, equivocate_round=1)
    slashed = [t for t in run.receipt.trainers if t.slashed]
    assert [t.address for t in slashed] == [run.trainers[0].address]
    count = slashed[0].accepted_submissions
    assert count > 0
    forged = forge(run, lambda i, row: (row[0], count, row[2], row[3], False) if row[4] else row)
    s = make_setup(chain, run)
    assert s.deposit(run.task_id).status == 1
    t0_key = run.trainers[0].key
    chain.fund(Account.from_key(t0_key).address)
    assert_refused_everywhere(s, forged, t0_key)
    before = s.balances()
    assert_honest_claim_pays_the_node_split(s)
    assert s.balances()["t0"] == before["t0"]  # the slashed trainer still gets nothing


@pytest.mark.parametrize(
    "field, edit",
    [
        ("stake", lambda i, row: (row[0], row[1], row[2] + 1, row[3], row[4]) if i == 0 else row),
        ("did", lambda i, row: (row[0], row[1], row[2], "did:tenzro:node:someone-else", row[4]) if i == 0 else row),
    ],
)
def test_invalid_uncommitted_trainer_fields_are_bound_too(funded: Setup, field: str, edit: Any) -> None:
    assert_refused_everywhere(funded, forge(funded.run, edit), SPONSOR.key)


def test_invalid_other_sealed_at_is_bound_too(funded: Setup) -> None:
    value = list(_abi_value(funded.run.receipt))
    value[10] += 1
    assert_refused_everywhere(funded, eth_abi.encode([RECEIPT_ABI_TYPE], [tuple(value)]), SPONSOR.key)


def test_sealed_record_is_root_and_digest_of_the_getreceipt_abi(sealed_run: SealedRun) -> None:
    abi = bytes.fromhex(sealed_run.service.get_receipt(sealed_run.task_id)["abi"][2:])
    record = sealed_lookup_from_store(sealed_run.store)(sealed_run.task_id)
    assert record == SealedReceipt(sealed_run.run_root, hashlib.sha256(abi).digest())
    assert record == compute_sealed_receipt(sealed_run.receipt)
    assert compute_receipt_digest(abi) == hashlib.sha256(abi).digest()


class _EqualToAnything(bytes):
    """bytes whose comparisons always say "equal": a lookup answer that could decide its own
    comparison would let whatever the lookup returns vouch for any input."""

    def __eq__(self, other: object) -> bool:
        return True

    def __ne__(self, other: object) -> bool:
        return False

    __hash__ = bytes.__hash__


def flip_last_byte(value: bytes) -> bytes:
    return value[:-1] + bytes([value[-1] ^ 1])


def test_invalid_lookup_answers_that_are_not_a_well_formed_sealed_record(sealed_run: SealedRun) -> None:
    data = sealed_run.run_root + sealed_run.abi
    good = compute_sealed_receipt(sealed_run.receipt)
    assert training_verify(data, lambda t: good) == VALID
    for held in (
        # Every byte of both values is compared: a record off in the last byte is another record.
        SealedReceipt(flip_last_byte(sealed_run.run_root), good.receipt_digest),
        SealedReceipt(sealed_run.run_root, flip_last_byte(good.receipt_digest)),
        SealedReceipt(_EqualToAnything(sealed_run.run_root), good.receipt_digest),
        SealedReceipt(sealed_run.run_root, _EqualToAnything(good.receipt_digest)),
        sealed_run.run_root,  # the old answer (a bare root) no longer passes
        SealedReceipt(sealed_run.run_root, b"\x00" * 32),
        SealedReceipt(b"\x00" * 32, good.receipt_digest),
        SealedReceipt(bytearray(sealed_run.run_root), good.receipt_digest),  # type: ignore[arg-type]
        SealedReceipt(sealed_run.run_root, good.receipt_digest[:31]),
        SealedReceipt(sealed_run.run_root, bytearray(good.receipt_digest)),  # type: ignore[arg-type]
        (sealed_run.run_root, good.receipt_digest),
        None,
    ):
        assert training_verify(data, lambda t, held=held: held) == INVALID, held  # type: ignore[misc]
