"""Tests for tenzro_training.ledger: pure TNZO balance, escrow and stake operations."""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tenzro_training.errors import TenzroError
from tenzro_training.ledger import (
    UINT256_LIMIT,
    AmountOutOfRange,
    BondNotFound,
    Escrow,
    EscrowExists,
    EscrowNotFound,
    InsufficientBalance,
    InsufficientEscrow,
    InvalidLedgerInput,
    Ledger,
    LedgerError,
    SponsorMismatch,
    SupplyOverflow,
    bond_stake,
    compute_changes,
    compute_payouts,
    credit,
    escrow_reward,
    refund_escrow,
    settle_run,
    slash_stake,
    transfer,
    unbond_stake,
)

ALICE = bytes.fromhex("11" * 20)
BOB = bytes.fromhex("22" * 20)
CAROL = bytes.fromhex("03" * 20)
TASK = "task-1"
MAX = UINT256_LIMIT - 1


def funded(**balances: int) -> Ledger:
    ledger = Ledger()
    for name, amount in balances.items():
        ledger = credit(ledger, {"alice": ALICE, "bob": BOB, "carol": CAROL}[name], amount)
    return ledger


def snapshot(ledger: Ledger) -> tuple:
    """A plain copy of everything a ledger holds, to prove an operation changed nothing."""
    return (dict(ledger.accounts), dict(ledger.escrows), dict(ledger.bonds), ledger.minted, ledger.burned)


# --- basic operations ----------------------------------------------------------------------


def test_empty_ledger() -> None:
    ledger = Ledger()
    assert ledger.total_supply() == 0 and ledger.minted == 0 and ledger.burned == 0
    assert list(ledger.balances()) == []
    assert ledger.balance_of(ALICE) == 0
    assert ledger.escrow_of(TASK) is None
    assert list(ledger.bonds_of(TASK)) == []
    assert ledger.bond_of(TASK, ALICE) is None


def test_credit_and_transfer() -> None:
    ledger = funded(alice=100)
    assert ledger.balance_of(ALICE) == 100 and ledger.minted == 100
    after = transfer(ledger, ALICE, BOB, 30)
    assert after.balance_of(ALICE) == 70 and after.balance_of(BOB) == 30
    assert ledger.balance_of(ALICE) == 100  # input untouched
    assert after.total_supply() == 100


def test_transfer_whole_balance_removes_account() -> None:
    after = transfer(funded(alice=5), ALICE, BOB, 5)
    assert ALICE not in after.accounts
    assert list(after.balances()) == [(BOB, 5)]
    assert after == Ledger(accounts={BOB: 5}, minted=5)


def test_self_transfer_and_zero_transfer() -> None:
    ledger = funded(alice=5)
    assert transfer(ledger, ALICE, ALICE, 5) == ledger
    assert transfer(ledger, ALICE, BOB, 0) == ledger
    assert transfer(Ledger(), ALICE, BOB, 0) == Ledger()


def test_balances_iterate_in_address_byte_order() -> None:
    ledger = funded(bob=1, alice=2, carol=3)
    assert [a for a, _ in ledger.balances()] == [CAROL, ALICE, BOB]


def test_escrow_refund_cycle() -> None:
    ledger = escrow_reward(funded(alice=100), TASK, ALICE, 60)
    assert ledger.balance_of(ALICE) == 40
    assert ledger.escrow_of(TASK) == Escrow(sponsor=ALICE, amount=60)
    assert ledger.total_supply() == 100
    refunded = refund_escrow(ledger, TASK)
    assert refunded.escrow_of(TASK) is None
    assert refunded == funded(alice=100)


def test_zero_escrow_is_recorded() -> None:
    ledger = escrow_reward(Ledger(), TASK, ALICE, 0)
    assert ledger.escrow_of(TASK) == Escrow(sponsor=ALICE, amount=0)
    assert refund_escrow(ledger, TASK) == Ledger()


def test_bond_unbond_cycle() -> None:
    ledger = bond_stake(funded(bob=50), TASK, BOB, 20)
    ledger = bond_stake(ledger, TASK, BOB, 5)  # bonding again adds
    assert ledger.bond_of(TASK, BOB) == 25
    assert list(ledger.bonds_of(TASK)) == [(BOB, 25)]
    assert list(ledger.bonds_of("other")) == []
    assert ledger.balance_of(BOB) == 25
    assert unbond_stake(ledger, TASK, BOB) == funded(bob=50)


def test_zero_bond_is_recorded_and_unbondable() -> None:
    ledger = bond_stake(Ledger(), TASK, BOB, 0)
    assert ledger.bond_of(TASK, BOB) == 0
    assert list(ledger.bonds_of(TASK)) == [(BOB, 0)]
    assert unbond_stake(ledger, TASK, BOB) == Ledger()


def test_bonds_of_sorted_and_scoped_to_task() -> None:
    ledger = funded(alice=10, bob=10, carol=10)
    ledger = bond_stake(ledger, TASK, BOB, 1)
    ledger = bond_stake(ledger, TASK, ALICE, 2)
    ledger = bond_stake(ledger, "other", CAROL, 3)
    assert list(ledger.bonds_of(TASK)) == [(ALICE, 2), (BOB, 1)]
    assert list(ledger.bonds_of("other")) == [(CAROL, 3)]


def test_slash_burns_the_bond() -> None:
    ledger = bond_stake(funded(bob=50), TASK, BOB, 20)
    slashed, amount = slash_stake(ledger, TASK, BOB)
    assert amount == 20
    assert slashed.bond_of(TASK, BOB) is None
    assert slashed.burned == 20 and slashed.minted == 50
    assert slashed.total_supply() == 30 == slashed.minted - slashed.burned
    assert slashed.balance_of(BOB) == 30


def test_slash_of_a_zero_bond_removes_it() -> None:
    # A zero bond records an enrolment; slashing it burns nothing but does end it, as for any bond.
    ledger = bond_stake(funded(bob=5), TASK, BOB, 0)
    slashed, amount = slash_stake(ledger, TASK, BOB)
    assert amount == 0
    assert slashed.bond_of(TASK, BOB) is None and list(slashed.bonds_of(TASK)) == []
    assert slashed == funded(bob=5)


def test_slash_twice_is_a_no_op() -> None:
    ledger = bond_stake(funded(bob=50), TASK, BOB, 20)
    once, first = slash_stake(ledger, TASK, BOB)
    twice, second = slash_stake(once, TASK, BOB)
    assert (first, second) == (20, 0)
    assert twice is once


def test_settle_run_pays_and_returns_remainder() -> None:
    ledger = escrow_reward(funded(alice=1000), TASK, ALICE, 100)
    payouts, remainder = compute_payouts(100, {BOB: 1, CAROL: 2})
    assert payouts == {CAROL: 66, BOB: 33} and remainder == 1
    settled = settle_run(ledger, TASK, payouts, ALICE)
    assert settled.balance_of(BOB) == 33
    assert settled.balance_of(CAROL) == 66
    assert settled.balance_of(ALICE) == 900 + remainder
    assert settled.escrow_of(TASK) is None
    assert settled.total_supply() == 1000


def test_settle_run_with_no_payouts_refunds_sponsor() -> None:
    ledger = escrow_reward(funded(alice=10), TASK, ALICE, 10)
    assert settle_run(ledger, TASK, {}, ALICE) == funded(alice=10)


# --- invalid operations: the right error, and the input untouched ---------------------------


def test_invalid_transfer_insufficient_balance() -> None:
    ledger = funded(alice=10)
    before = snapshot(ledger)
    with pytest.raises(InsufficientBalance) as info:
        transfer(ledger, ALICE, BOB, 11)
    assert (info.value.address, info.value.needed, info.value.available) == (ALICE, 11, 10)
    assert isinstance(info.value, LedgerError) and isinstance(info.value, TenzroError)
    assert snapshot(ledger) == before


def test_invalid_transfer_from_unknown_account() -> None:
    with pytest.raises(InsufficientBalance) as info:
        transfer(Ledger(), BOB, ALICE, 1)
    assert info.value.available == 0


def test_invalid_escrow_insufficient_balance() -> None:
    ledger = funded(alice=10)
    before = snapshot(ledger)
    with pytest.raises(InsufficientBalance) as info:
        escrow_reward(ledger, TASK, ALICE, 11)
    assert (info.value.needed, info.value.available) == (11, 10)
    assert snapshot(ledger) == before and ledger.escrow_of(TASK) is None


def test_invalid_escrow_twice() -> None:
    ledger = escrow_reward(funded(alice=10), TASK, ALICE, 5)
    before = snapshot(ledger)
    with pytest.raises(EscrowExists) as info:
        escrow_reward(ledger, TASK, ALICE, 5)
    assert info.value.task_id == TASK
    assert snapshot(ledger) == before


def test_invalid_bond_insufficient_balance() -> None:
    ledger = bond_stake(funded(bob=10), TASK, BOB, 4)
    before = snapshot(ledger)
    with pytest.raises(InsufficientBalance):
        bond_stake(ledger, TASK, BOB, 7)
    assert snapshot(ledger) == before


def test_invalid_unbond_without_bond() -> None:
    with pytest.raises(BondNotFound) as info:
        unbond_stake(funded(bob=1), TASK, BOB)
    assert (info.value.task_id, info.value.trainer) == (TASK, BOB)


def test_invalid_refund_without_escrow() -> None:
    with pytest.raises(EscrowNotFound) as info:
        refund_escrow(Ledger(), TASK)
    assert info.value.task_id == TASK


def test_invalid_settle_without_escrow() -> None:
    with pytest.raises(EscrowNotFound):
        settle_run(Ledger(), TASK, {}, ALICE)


def test_invalid_settle_wrong_sponsor() -> None:
    ledger = escrow_reward(funded(alice=10), TASK, ALICE, 10)
    before = snapshot(ledger)
    with pytest.raises(SponsorMismatch) as info:
        settle_run(ledger, TASK, {BOB: 1}, BOB)
    assert (info.value.expected, info.value.actual) == (ALICE, BOB)
    assert snapshot(ledger) == before


def test_invalid_settle_payouts_exceed_escrow() -> None:
    ledger = escrow_reward(funded(alice=10), TASK, ALICE, 10)
    before = snapshot(ledger)
    with pytest.raises(InsufficientEscrow) as info:
        settle_run(ledger, TASK, {BOB: 6, CAROL: 5}, ALICE)
    assert (info.value.task_id, info.value.needed, info.value.available) == (TASK, 11, 10)
    assert snapshot(ledger) == before


@pytest.mark.parametrize("amount", [-1, UINT256_LIMIT, 2**300, True, False, 1.0, "1", None])
def test_invalid_amounts(amount: Any) -> None:
    ledger = funded(alice=10)
    before = snapshot(ledger)
    calls = [
        lambda: credit(ledger, ALICE, amount),
        lambda: transfer(ledger, ALICE, BOB, amount),
        lambda: escrow_reward(ledger, TASK, ALICE, amount),
        lambda: bond_stake(ledger, TASK, ALICE, amount),
        lambda: compute_payouts(amount, {ALICE: 1}),
        lambda: compute_payouts(10, {ALICE: amount}),
    ]
    for call in calls:
        with pytest.raises(AmountOutOfRange) as info:
            call()
        assert info.value.value is amount
    assert snapshot(ledger) == before


def test_uint256_upper_bound() -> None:
    ledger = credit(Ledger(), ALICE, MAX)
    assert ledger.balance_of(ALICE) == MAX == ledger.total_supply()
    assert transfer(ledger, ALICE, BOB, MAX).balance_of(BOB) == MAX
    with pytest.raises(SupplyOverflow) as info:
        credit(ledger, BOB, 1)
    assert (info.value.minted, info.value.amount) == (MAX, 1)
    # Burning does not free room: minted counts everything ever created.
    bonded = bond_stake(ledger, TASK, ALICE, MAX)
    burned, _ = slash_stake(bonded, TASK, ALICE)
    with pytest.raises(SupplyOverflow):
        credit(burned, ALICE, 1)


@pytest.mark.parametrize("address", [b"", bytes(19), bytes(21), bytearray(20), "0x" + "11" * 20, None])
def test_invalid_addresses(address: Any) -> None:
    ledger = funded(alice=10)
    escrowed = escrow_reward(ledger, TASK, ALICE, 10)
    calls = [
        lambda: credit(ledger, address, 1),
        lambda: transfer(ledger, ALICE, address, 1),
        lambda: transfer(ledger, address, ALICE, 1),
        lambda: escrow_reward(ledger, TASK, address, 1),
        lambda: bond_stake(ledger, TASK, address, 1),
        lambda: unbond_stake(ledger, TASK, address),
        lambda: slash_stake(ledger, TASK, address),
        lambda: ledger.balance_of(address),
        lambda: ledger.bond_of(TASK, address),
        lambda: settle_run(escrowed, TASK, {}, address),
    ]
    if not isinstance(address, bytearray):  # a bytearray cannot even be a dict key
        calls.append(lambda: compute_payouts(1, {address: 1}))
    for call in calls:
        with pytest.raises(InvalidLedgerInput):
            call()


@pytest.mark.parametrize("task_id", ["", None, 7, b"task", []])
def test_invalid_task_ids(task_id: Any) -> None:
    ledger = funded(alice=10)
    calls = [
        lambda: escrow_reward(ledger, task_id, ALICE, 1),
        lambda: refund_escrow(ledger, task_id),
        lambda: bond_stake(ledger, task_id, ALICE, 1),
        lambda: unbond_stake(ledger, task_id, ALICE),
        lambda: slash_stake(ledger, task_id, ALICE),
        lambda: settle_run(ledger, task_id, {}, ALICE),
        lambda: ledger.escrow_of(task_id),
        lambda: list(ledger.bonds_of(task_id)),
    ]
    for call in calls:
        with pytest.raises(InvalidLedgerInput) as info:
            call()
        assert info.value.field == "task_id"


def test_invalid_payout_mappings() -> None:
    ledger = escrow_reward(funded(alice=10), TASK, ALICE, 10)
    with pytest.raises(InvalidLedgerInput):
        settle_run(ledger, TASK, [(BOB, 1)], ALICE)  # type: ignore[arg-type]
    with pytest.raises(AmountOutOfRange):
        settle_run(ledger, TASK, {BOB: -1, CAROL: 2}, ALICE)
    with pytest.raises(InvalidLedgerInput):
        compute_payouts(10, [(BOB, 1)])  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "payouts, field",
    [
        ({b"short": 1}, "payouts key"),
        ({BOB: True}, "payouts value"),
        ({BOB: -1, CAROL: 2}, "payouts value"),
    ],
)
def test_invalid_payouts_are_refused_by_name(payouts: dict, field: str) -> None:
    # Each payout entry is checked as a payout, before anything is credited: a bad entry is not
    # left for the ledger's own account checks to catch (True would even pass those as 1).
    ledger = escrow_reward(funded(alice=10), TASK, ALICE, 10)
    before = snapshot(ledger)
    with pytest.raises(InvalidLedgerInput) as info:
        settle_run(ledger, TASK, payouts, ALICE)
    assert info.value.field == field
    assert snapshot(ledger) == before


def test_invalid_weights_total_over_uint256() -> None:
    with pytest.raises(AmountOutOfRange) as info:
        compute_payouts(10, {ALICE: MAX, BOB: 1})
    assert info.value.field == "weights total"


# --- construction from stored entries and immutability --------------------------------------


def test_construct_from_entries_copies_and_freezes() -> None:
    accounts = {ALICE: 5, BOB: 0}
    ledger = Ledger(
        accounts=accounts,
        escrows={TASK: Escrow(sponsor=ALICE, amount=3)},
        bonds={(TASK, BOB): 2},
        minted=12,
        burned=2,
    )
    accounts[ALICE] = 999
    assert ledger.balance_of(ALICE) == 5
    assert BOB not in ledger.accounts  # zero balances are dropped: one canonical form
    with pytest.raises(TypeError):
        ledger.accounts[ALICE] = 1  # type: ignore[index]
    with pytest.raises(TypeError):
        ledger.bonds[(TASK, BOB)] = 1  # type: ignore[index]
    with pytest.raises(dataclasses.FrozenInstanceError):
        ledger.minted = 0  # type: ignore[misc]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"accounts": {ALICE: 5}, "minted": 4},  # supply does not add up
        {"accounts": {ALICE: 5}, "minted": 5, "burned": 1},
        {"accounts": {ALICE: -1}, "minted": 0},
        {"accounts": {b"short": 1}, "minted": 1},
        {"escrows": {TASK: (ALICE, 1)}, "minted": 1},
        {"escrows": {"": Escrow(sponsor=ALICE, amount=1)}, "minted": 1},
        {"bonds": {TASK: 1}, "minted": 1},
        {"bonds": {(TASK, ALICE, 0): 1}, "minted": 1},
        {"bonds": {(TASK, ALICE): UINT256_LIMIT}, "minted": 0},
        {"minted": -1, "burned": -1},
        {"minted": True, "burned": True},
    ],
)
def test_invalid_ledger_construction(kwargs: dict) -> None:
    with pytest.raises(InvalidLedgerInput):
        Ledger(**kwargs)


class _NamedKey(tuple):
    """A tuple subclass: not the plain (task_id, trainer) tuple a bond key must be."""


@pytest.mark.parametrize(
    "kwargs, field",
    [
        # Each entry is wrong in one way only and the supply adds up, so only the check named
        # by ``field`` can refuse it.
        ({"bonds": {("", ALICE): 1}, "minted": 1}, "task_id"),
        ({"bonds": {(7, ALICE): 1}, "minted": 1}, "task_id"),
        ({"bonds": {(TASK, b"short"): 1}, "minted": 1}, "bonds key"),
        ({"bonds": {_NamedKey((TASK, ALICE)): 1}, "minted": 1}, "bonds key"),
        ({"bonds": {(TASK, ALICE): True}, "minted": 1}, "bonds value"),
        ({"bonds": {(TASK, ALICE): -1}, "minted": 0, "burned": 1}, "bonds value"),
        ({"accounts": {ALICE: 1}, "minted": True}, "minted"),
        ({"accounts": {ALICE: 1}, "minted": 2, "burned": True}, "burned"),
        ({"accounts": {ALICE: 3}, "minted": 4}, "supply"),  # less held than minted - burned
    ],
)
def test_invalid_ledger_construction_names_the_entry(kwargs: dict, field: str) -> None:
    with pytest.raises(InvalidLedgerInput) as info:
        Ledger(**kwargs)
    assert info.value.field == field


@pytest.mark.parametrize("kwargs", [{"sponsor": b"x", "amount": 1}, {"sponsor": ALICE, "amount": -1}])
def test_invalid_escrow_value(kwargs: dict) -> None:
    with pytest.raises(InvalidLedgerInput):
        Escrow(**kwargs)


def test_ledger_equality_is_by_value() -> None:
    one = transfer(funded(alice=10), ALICE, BOB, 4)
    two = credit(credit(Ledger(), BOB, 4), ALICE, 6)
    assert one == two
    assert one != funded(alice=10)


# --- compute_payouts -----------------------------------------------------------------------


def test_payouts_zero_total_weight_returns_everything() -> None:
    payouts, remainder = compute_payouts(100, {ALICE: 0, BOB: 0})
    assert payouts == {ALICE: 0, BOB: 0} and remainder == 100
    assert compute_payouts(100, {}) == ({}, 100)


def test_payouts_documented_rounding() -> None:
    # floor(10 * 1 / 3) = 3 for each of three equal weights; remainder 1.
    payouts, remainder = compute_payouts(10, {ALICE: 1, BOB: 1, CAROL: 1})
    assert payouts == {ALICE: 3, BOB: 3, CAROL: 3} and remainder == 1
    assert list(payouts) == [CAROL, ALICE, BOB]  # ascending address bytes


def test_payouts_large_intermediate_product_is_exact() -> None:
    # pool * w exceeds 256 bits here; the result must still be the exact floor (as mulDiv gives),
    # which floating point would get wrong.
    payouts, remainder = compute_payouts(MAX, {ALICE: 3, BOB: 4})
    assert payouts[ALICE] == (MAX * 3) // 7 and payouts[BOB] == (MAX * 4) // 7
    assert payouts[ALICE] != int(MAX * (3 / 7))
    assert sum(payouts.values()) + remainder == MAX and remainder == 1
    payouts, remainder = compute_payouts(MAX, {ALICE: MAX - 1, BOB: 1})
    assert payouts == {ALICE: MAX - 1, BOB: 1} and remainder == 0


weights_strategy = st.dictionaries(
    st.binary(min_size=20, max_size=20),
    st.one_of(st.integers(0, 100), st.integers(0, 2**200)),
    max_size=8,
)


@settings(max_examples=300, deadline=None)
@given(pool=st.one_of(st.integers(0, 10**6), st.integers(0, MAX)), weights=weights_strategy)
def test_payouts_properties(pool: int, weights: dict[bytes, int]) -> None:
    payouts, remainder = compute_payouts(pool, weights)
    total = sum(weights.values())
    assert set(payouts) == set(weights)
    assert sum(payouts.values()) + remainder == pool  # exact, never more than the pool
    assert 0 <= remainder <= pool
    if total == 0:
        assert remainder == pool and all(p == 0 for p in payouts.values())
        return
    nonzero = sum(1 for w in weights.values() if w)
    assert remainder < max(nonzero, 1)  # each floor loses less than one unit
    for address, weight in weights.items():
        # payout is exactly floor(pool * w / W)
        assert payouts[address] * total <= pool * weight < (payouts[address] + 1) * total
    for a in weights:  # proportional: more weight never means less pay
        for b in weights:
            if weights[a] >= weights[b]:
                assert payouts[a] >= payouts[b]


# --- operation sequences against a reference model ------------------------------------------

ADDRS = [ALICE, BOB, CAROL]
TASKS = ["t0", "t1"]
addr_st = st.sampled_from(ADDRS)
task_st = st.sampled_from(TASKS)
pick_st = st.one_of(st.none(), st.integers(0, 7))
small_st = st.integers(0, 40)
# Mostly small amounts so that operations succeed; now and then one near 2**256 to reach overflow.
amount_st = st.one_of(small_st, small_st, small_st, small_st, st.sampled_from([MAX, MAX - 5, 2**255]))

op_st = st.one_of(
    st.tuples(st.just("credit"), addr_st, amount_st),
    st.tuples(st.just("transfer"), addr_st, addr_st, amount_st),
    st.tuples(st.just("escrow"), task_st, addr_st, amount_st),
    st.tuples(st.just("bond"), task_st, addr_st, amount_st),
    st.tuples(st.just("unbond"), task_st, addr_st, pick_st),
    st.tuples(st.just("slash"), task_st, addr_st, pick_st),
    st.tuples(st.just("refund"), task_st, pick_st),
    st.tuples(st.just("settle"), task_st, st.dictionaries(addr_st, st.integers(0, 5)), addr_st, pick_st),
)


def resolve(op: tuple, ledger: Ledger) -> tuple:
    """Drop the op's trailing ``pick``; if it is an int, aim the op at an entry that exists.

    Random (task, address) pairs rarely name an existing bond or escrow, so without this the
    success paths of unbond/slash/refund/settle would hardly ever run.
    """
    kind, pick = op[0], op[-1]
    op = op[:-1] if kind in ("unbond", "slash", "refund", "settle") else op
    if pick is None or kind not in ("unbond", "slash", "refund", "settle"):
        return op
    if kind in ("unbond", "slash") and ledger.bonds:
        task_id, trainer = sorted(ledger.bonds)[pick % len(ledger.bonds)]
        return (kind, task_id, trainer)
    if kind in ("refund", "settle") and ledger.escrows:
        task_id = sorted(ledger.escrows)[pick % len(ledger.escrows)]
        if kind == "refund":
            return (kind, task_id)
        return (kind, task_id, op[2], ledger.escrows[task_id].sponsor)
    return op


class Model:
    """A deliberately naive mutable ledger; returns False where the real one must refuse."""

    def __init__(self) -> None:
        self.bal: dict[bytes, int] = {}
        self.esc: dict[str, tuple[bytes, int]] = {}
        self.bonds: dict[tuple[str, bytes], int] = {}
        self.minted = 0
        self.burned = 0

    def apply(self, op: tuple, payouts: Optional[dict]) -> bool:
        kind = op[0]
        if kind == "credit":
            _, a, x = op
            if self.minted + x > MAX:
                return False
            self.bal[a] = self.bal.get(a, 0) + x
            self.minted += x
        elif kind == "transfer":
            _, a, b, x = op
            if self.bal.get(a, 0) < x:
                return False
            self.bal[a] = self.bal.get(a, 0) - x
            self.bal[b] = self.bal.get(b, 0) + x
        elif kind == "escrow":
            _, t, a, x = op
            if t in self.esc or self.bal.get(a, 0) < x:
                return False
            self.bal[a] = self.bal.get(a, 0) - x
            self.esc[t] = (a, x)
        elif kind == "bond":
            _, t, a, x = op
            if self.bal.get(a, 0) < x:
                return False
            self.bal[a] = self.bal.get(a, 0) - x
            self.bonds[(t, a)] = self.bonds.get((t, a), 0) + x
        elif kind == "unbond":
            _, t, a = op
            if (t, a) not in self.bonds:
                return False
            self.bal[a] = self.bal.get(a, 0) + self.bonds.pop((t, a))
        elif kind == "slash":
            _, t, a = op
            self.burned += self.bonds.pop((t, a), 0)
        elif kind == "refund":
            _, t = op
            if t not in self.esc:
                return False
            sponsor, x = self.esc.pop(t)
            self.bal[sponsor] = self.bal.get(sponsor, 0) + x
        elif kind == "settle":
            _, t, _, sponsor = op
            if t not in self.esc or self.esc[t][0] != sponsor:
                return False
            _, x = self.esc.pop(t)
            assert payouts is not None
            for a, p in payouts.items():
                self.bal[a] = self.bal.get(a, 0) + p
                x -= p
            self.bal[sponsor] = self.bal.get(sponsor, 0) + x
        return True

    def state(self) -> tuple:
        bal = {a: x for a, x in self.bal.items() if x}
        esc = {t: Escrow(sponsor=s, amount=x) for t, (s, x) in self.esc.items()}
        return (bal, esc, dict(self.bonds), self.minted, self.burned)


def apply_real(ledger: Ledger, op: tuple, payouts: Optional[dict]) -> Ledger:
    kind = op[0]
    if kind == "credit":
        return credit(ledger, op[1], op[2])
    if kind == "transfer":
        return transfer(ledger, op[1], op[2], op[3])
    if kind == "escrow":
        return escrow_reward(ledger, op[1], op[2], op[3])
    if kind == "bond":
        return bond_stake(ledger, op[1], op[2], op[3])
    if kind == "unbond":
        return unbond_stake(ledger, op[1], op[2])
    if kind == "slash":
        after, amount = slash_stake(ledger, op[1], op[2])
        assert after.burned == ledger.burned + amount
        assert amount == (ledger.bond_of(op[1], op[2]) or 0)
        return after
    if kind == "refund":
        return refund_escrow(ledger, op[1])
    return settle_run(ledger, op[1], payouts or {}, op[3])


def apply_changes(before: Ledger, after: Ledger) -> Ledger:
    """Rebuild `after` from `before` plus compute_changes, the way the node's storage would."""
    changes = compute_changes(before, after)
    accounts = dict(before.accounts)
    accounts.update(changes.balances)
    escrows = dict(before.escrows)
    for task_id, escrow in changes.escrows:
        if escrow is None:
            del escrows[task_id]
        else:
            escrows[task_id] = escrow
    bonds = dict(before.bonds)
    for key, amount in changes.bonds:
        if amount is None:
            del bonds[key]
        else:
            bonds[key] = amount
    return Ledger(accounts=accounts, escrows=escrows, bonds=bonds, minted=changes.minted, burned=changes.burned)


GENESIS = [("credit", a, 100) for a in ADDRS]


@settings(max_examples=300, deadline=None)
@given(st.lists(op_st, min_size=10, max_size=40))
def test_operation_sequences_conserve_supply_and_match_model(ops: list[tuple]) -> None:
    ledger = Ledger()
    model = Model()
    for raw_op in GENESIS + ops:
        op = resolve(raw_op, ledger)
        payouts = None
        if op[0] == "settle" and ledger.escrow_of(op[1]) is not None:
            payouts, _ = compute_payouts(ledger.escrow_of(op[1]).amount, op[2])
        before = snapshot(ledger)
        expected_ok = model.apply(op, payouts)
        try:
            after = apply_real(ledger, op, payouts)
        except LedgerError:
            assert not expected_ok, f"real ledger refused {op} that the model accepts"
            assert snapshot(ledger) == before  # a refusal changes nothing
            continue
        assert expected_ok, f"real ledger accepted {op} that the model refuses"
        assert snapshot(ledger) == before  # the input is never mutated
        assert snapshot(after) == model.state()
        # conservation: nothing is created except by credit, nothing destroyed except by slash
        assert after.total_supply() == after.minted - after.burned
        assert after.total_supply() < UINT256_LIMIT
        assert all(0 < x < UINT256_LIMIT for _, x in after.balances())
        assert apply_changes(ledger, after) == after
        ledger = after


def test_changes_of_a_ledger_handed_on_unchanged_are_none_but_the_counters() -> None:
    """The node's every submission passes the same ledger object on: no entry is written, and
    an equal ledger built apart gives the same (empty) answer by the entry-by-entry route."""
    ledger = Ledger()
    for raw_op in GENESIS:
        ledger = apply_real(ledger, resolve(raw_op, ledger), None)
    assert ledger.accounts  # a ledger with entries, so an empty answer means something
    same = compute_changes(ledger, ledger)
    assert (same.balances, same.escrows, same.bonds) == ((), (), ())
    assert (same.minted, same.burned) == (ledger.minted, ledger.burned)
    rebuilt = Ledger(accounts=ledger.accounts, escrows=ledger.escrows, bonds=ledger.bonds,
                     minted=ledger.minted, burned=ledger.burned)
    assert rebuilt is not ledger
    assert compute_changes(ledger, rebuilt) == same


def test_changes_list_entries_in_canonical_key_order() -> None:
    tasks = [f"task-{c}" for c in "hgfedcba"]
    before = bond_stake(funded(alice=100, bob=100, carol=5), "kept", CAROL, 5)
    after = before
    for task_id in tasks:
        after = escrow_reward(after, task_id, ALICE, 1)
        after = bond_stake(after, task_id, BOB, 1)
    changes = compute_changes(before, after)
    assert [task_id for task_id, _ in changes.escrows] == sorted(tasks)
    assert [key for key, _ in changes.bonds] == sorted((t, BOB) for t in tasks)  # not the bond kept
    assert changes.balances == ((ALICE, 92), (BOB, 92))
    back = compute_changes(after, before)
    assert back.escrows == tuple((t, None) for t in sorted(tasks))
    assert back.bonds == tuple(((t, BOB), None) for t in sorted(tasks))
