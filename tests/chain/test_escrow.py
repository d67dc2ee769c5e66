"""TenzroRewardEscrow on a py-evm chain with TRAINING_VERIFY: a real sealed receipt pays every
trainer floor(amount * weight / totalWeight) exactly once (dust to the sponsor); every tampered,
unsealed, mismatched, repeated or malformed claim fails and leaves all balances unchanged."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path
from typing import Any

import eth_abi
import pytest
from eth_account import Account
from eth_utils import keccak
from web3.logs import DISCARD

from tenzro_training.receipt_abi import RECEIPT_ABI_TYPE, _abi_value, encode_receipt
from tenzro_training.records import encode_round_record
from tests.chain.conftest import Chain, SealedRun, run_to_sealed
from tests.node.conftest import SPONSOR, STRANGER

AMOUNT = 10**18 + 7
DEADLINE = 4_000_000_000
GAS = 3_000_000


@dataclasses.dataclass
class Setup:
    chain: Chain
    token: Any
    escrow: Any
    run: SealedRun

    def balances(self) -> dict[str, int]:
        who = {"escrow": self.escrow.address, "sponsor": Account.from_key(SPONSOR.key).address,
               "stranger": Account.from_key(STRANGER.key).address}
        who.update({f"t{i}": Account.from_key(t.key).address for i, t in enumerate(self.run.trainers)})
        return {name: self.token.functions.balanceOf(addr).call() for name, addr in who.items()}

    def deposit(self, task_id: str, amount: int = AMOUNT, key: bytes = SPONSOR.key, deadline: int = DEADLINE) -> Any:
        c = self.chain
        c.send(self.token.functions.approve(self.escrow.address, amount), key)
        return c.send(self.escrow.functions.deposit(task_id, self.token.address, amount, deadline), key)

    def claim(self, receipt: bytes, root: bytes, key: bytes = STRANGER.key) -> Any:
        return self.chain.send(self.escrow.functions.claim(receipt, root), key, gas=GAS)

    def revert_name(self, fn: Any, key: bytes = STRANGER.key) -> str:
        """The custom error a call reverts with (by selector), or "" when it does not revert."""
        sender = Account.from_key(key).address
        try:
            fn.call({"from": sender, "gas": GAS})
        except Exception as exc:  # noqa: BLE001 -- eth-tester's TransactionFailed carries the data
            # "execution reverted: b'<raw revert data>'": the first 4 bytes are the selector.
            message = str(exc.args[0]) if exc.args else ""
            _, _, literal = message.partition(": ")
            try:
                raw = ast.literal_eval(literal)
            except (ValueError, SyntaxError):
                return "revert"
            for item in self.escrow.abi:
                if item["type"] == "error":
                    sig = f"{item['name']}({','.join(i['type'] for i in item['inputs'])})"
                    if isinstance(raw, bytes) and raw[:4] == keccak(text=sig)[:4]:
                        return str(item["name"])
            return "revert"
        return ""


def make_setup(chain: Chain, run: SealedRun) -> Setup:
    for key in (SPONSOR.key, STRANGER.key):
        chain.fund(Account.from_key(key).address)
    token = chain.deploy("TestToken", "Test", "TST", key=SPONSOR.key)
    escrow = chain.deploy("TenzroRewardEscrow", key=SPONSOR.key)
    for key in (SPONSOR.key, STRANGER.key):
        assert chain.send(token.functions.mint(Account.from_key(key).address, 10 * AMOUNT), key).status == 1
    chain.sealed.use_store(run.store)
    return Setup(chain, token, escrow, run)


@pytest.fixture
def setup(chain: Chain, sealed_run: SealedRun) -> Setup:
    s = make_setup(chain, sealed_run)
    assert s.deposit(sealed_run.task_id).status == 1
    return s


def expected_payouts(run: SealedRun, amount: int) -> tuple[dict[str, int], int]:
    weights = {f"t{i}": 0 for i in range(len(run.trainers))}
    by_address = {t.address: f"t{i}" for i, t in enumerate(run.trainers)}
    for t in run.receipt.trainers:
        weights[by_address[t.address]] = t.reward_weight
    total = sum(weights.values())
    pay = {name: amount * w // total for name, w in weights.items()}
    return pay, amount - sum(pay.values())


def test_claim_pays_each_trainer_exactly(setup: Setup) -> None:
    run = setup.run
    assert sorted(t.accepted_submissions for t in run.receipt.trainers) == [2, 4, 4]
    before = setup.balances()
    assert before["escrow"] == AMOUNT
    receipt = setup.claim(run.abi, run.run_root)
    assert receipt.status == 1
    after = setup.balances()
    pay, dust = expected_payouts(run, AMOUNT)
    assert dust == 2  # floor((10**18 + 7) * [4, 4, 2] / 10) sums to 10**18 + 5
    for name, amount in pay.items():
        assert after[name] - before[name] == amount
    assert after["sponsor"] - before["sponsor"] == dust
    assert after["escrow"] == 0 and after["stranger"] == before["stranger"]  # the caller gets nothing
    paid = setup.escrow.events.Paid().process_receipt(receipt, errors=DISCARD)
    assert sorted(e.args.amount for e in paid) == sorted(pay.values())
    (claimed,) = setup.escrow.events.Claimed().process_receipt(receipt, errors=DISCARD)
    assert claimed.args.paid == AMOUNT - dust and claimed.args.dust == dust and claimed.args.payees == 3
    assert claimed.args.runRoot == run.run_root
    assert setup.escrow.functions.depositOf(keccak(text=run.task_id)).call()[2] == 2  # Claimed
    print(f"claim gas (3 trainers): {receipt.gasUsed}")


def test_payouts_equal_the_nodes_own_split(chain: Chain, sealed_run: SealedRun) -> None:
    # With the escrowed amount equal to the spec's pool, the chain pays what the node's ledger paid.
    s = make_setup(chain, sealed_run)
    pool = sealed_run.receipt.spec.reward_pool
    assert s.deposit(sealed_run.task_id, amount=pool).status == 1
    before = s.balances()
    assert s.claim(sealed_run.abi, sealed_run.run_root).status == 1
    after = s.balances()
    pay, dust = expected_payouts(sealed_run, pool)
    assert [after[f"t{i}"] - before[f"t{i}"] for i in range(3)] == [pay["t0"], pay["t1"], pay["t2"]] == [400, 400, 200]
    assert after["sponsor"] - before["sponsor"] == dust == 1


def _reencode(run: SealedRun, mutate: Any) -> bytes:
    r = run.receipt
    fields = list(_abi_value(r))
    fields[7] = list(fields[7])
    fields[8] = [list(t) for t in fields[8]]
    mutate(fields, r)
    fields[8] = [tuple(t) for t in fields[8]]
    return eth_abi.encode([RECEIPT_ABI_TYPE], [tuple(fields)])


def _flip_spec_byte(run: SealedRun) -> bytes:
    spec = run.receipt.spec.canonical_bytes()
    at = run.abi.find(spec) + spec.find(b'"max_rounds"') + 2
    return run.abi[:at] + bytes([run.abi[at] ^ 0x01]) + run.abi[at + 1 :]


def _tamper_round(fields: list[Any], r: Any) -> None:
    fields[7][1] = encode_round_record(dataclasses.replace(r.transcript[1], model_hash=b"\x33" * 32))


def _swap_payee(fields: list[Any], r: Any) -> None:
    fields[8][0][0] = Account.from_key(STRANGER.key).address


def _raise_weight(fields: list[Any], r: Any) -> None:
    fields[8][0][1] += 6


def _fake_root(fields: list[Any], r: Any) -> None:
    fields[5] = b"\x44" * 32


@pytest.mark.parametrize("case", ["spec_byte", "round_record", "payee", "weight", "root_field", "root_arg"])
def test_invalid_tampered_claims_fail(setup: Setup, case: str) -> None:
    run = setup.run
    root = run.run_root
    if case == "spec_byte":
        data = _flip_spec_byte(run)
    elif case == "round_record":
        data = _reencode(run, _tamper_round)
    elif case == "payee":
        data = _reencode(run, _swap_payee)
    elif case == "weight":
        data = _reencode(run, _raise_weight)
    elif case == "root_field":
        data = _reencode(run, _fake_root)
        root = b"\x44" * 32
    else:
        data, root = run.abi, b"\x44" * 32
    assert data != run.abi or root != run.run_root
    before = setup.balances()
    assert setup.claim(data, root).status == 0
    assert setup.balances() == before
    expected = "RootMismatch" if case == "root_arg" else "ReceiptNotVerified"
    assert setup.revert_name(setup.escrow.functions.claim(data, root)) == expected
    # the genuine receipt still works afterwards
    assert setup.claim(run.abi, run.run_root).status == 1


def test_invalid_receipt_of_a_run_the_chain_never_sealed(setup: Setup, tmp_path: Path) -> None:
    other = run_to_sealed(tmp_path, task_id="never-sealed", n_trainers=2, rounds=1)
    assert setup.deposit(other.task_id).status == 1
    before = setup.balances()
    assert setup.claim(other.abi, other.run_root).status == 0
    assert setup.balances() == before
    assert setup.revert_name(setup.escrow.functions.claim(other.abi, other.run_root)) == "ReceiptNotVerified"


def test_invalid_second_claim(setup: Setup) -> None:
    run = setup.run
    assert setup.claim(run.abi, run.run_root).status == 1
    before = setup.balances()
    assert setup.claim(run.abi, run.run_root).status == 0
    assert setup.balances() == before
    assert setup.revert_name(setup.escrow.functions.claim(run.abi, run.run_root)) == "NotOpen"


def test_invalid_claim_against_another_tasks_deposit(chain: Chain, sealed_run: SealedRun, tmp_path: Path) -> None:
    s = make_setup(chain, sealed_run)
    assert s.deposit("another-task").status == 1  # only another task holds funds
    before = s.balances()
    assert s.claim(sealed_run.abi, sealed_run.run_root).status == 0
    assert s.balances() == before
    assert s.revert_name(s.escrow.functions.claim(sealed_run.abi, sealed_run.run_root)) == "NotOpen"
    # With both deposits, the claim drains only its own task's.
    assert s.deposit(sealed_run.task_id).status == 1
    assert s.claim(sealed_run.abi, sealed_run.run_root).status == 1
    assert s.balances()["escrow"] == AMOUNT


def test_invalid_claim_when_the_depositor_is_not_the_sponsor(chain: Chain, sealed_run: SealedRun) -> None:
    s = make_setup(chain, sealed_run)
    assert s.deposit(sealed_run.task_id, key=STRANGER.key).status == 1
    before = s.balances()
    assert s.claim(sealed_run.abi, sealed_run.run_root).status == 0
    assert s.balances() == before
    assert s.revert_name(s.escrow.functions.claim(sealed_run.abi, sealed_run.run_root)) == "SponsorMismatch"


def test_refund_after_deadline_then_claim_fails(setup: Setup) -> None:
    run = setup.run
    sponsor = SPONSOR.key
    refund = setup.escrow.functions.refund(run.task_id)
    assert setup.revert_name(refund, sponsor) == "DeadlineNotReached"
    assert setup.chain.send(refund, sponsor).status == 0
    setup.chain.mine_at(DEADLINE + 1)
    assert setup.revert_name(refund, STRANGER.key) == "NotSponsor"
    before = setup.balances()
    receipt = setup.chain.send(refund, sponsor)
    assert receipt.status == 1
    after = setup.balances()
    assert after["sponsor"] - before["sponsor"] == AMOUNT and after["escrow"] == 0
    (event,) = setup.escrow.events.Refunded().process_receipt(receipt, errors=DISCARD)
    assert event.args.amount == AMOUNT
    assert setup.claim(run.abi, run.run_root).status == 0
    assert setup.chain.send(refund, sponsor).status == 0
    assert setup.balances() == after


def test_invalid_refund_after_claim(setup: Setup) -> None:
    run = setup.run
    assert setup.claim(run.abi, run.run_root).status == 1
    setup.chain.mine_at(DEADLINE + 1)
    before = setup.balances()
    assert setup.chain.send(setup.escrow.functions.refund(run.task_id), SPONSOR.key).status == 0
    assert setup.balances() == before


def test_invalid_deposits(setup: Setup) -> None:
    run = setup.run
    assert setup.revert_name(setup.escrow.functions.deposit(run.task_id, setup.token.address, 1, DEADLINE), SPONSOR.key) == "DepositExists"
    assert setup.revert_name(setup.escrow.functions.deposit("x", setup.token.address, 0, DEADLINE), SPONSOR.key) == "ZeroAmount"
    assert setup.revert_name(setup.escrow.functions.deposit("x", setup.token.address, 1, 1), SPONSOR.key) == "DeadlineInPast"


def test_invalid_truncated_and_random_receipts(setup: Setup) -> None:
    import random

    run = setup.run
    rng = random.Random(7)
    before = setup.balances()
    cases = [b"", run.abi[:32], run.abi[:-1], run.abi[: len(run.abi) // 2], rng.randbytes(64),
             rng.randbytes(len(run.abi)), run.abi + b"\x00" * 32]
    for data in cases:
        assert setup.claim(data, run.run_root).status == 0
    assert setup.balances() == before


def test_slashed_trainer_gets_nothing(chain: Chain, tmp_path: Path) -> None:
    run = run_to_sealed(tmp_path, task_id="slashed-run", equivocate=0)
    assert [t.slashed for t in run.receipt.trainers] == [True, False, False]
    s = make_setup(chain, run)
    assert s.deposit(run.task_id).status == 1
    before = s.balances()
    assert s.claim(run.abi, run.run_root).status == 1
    after = s.balances()
    assert after["t0"] == before["t0"]
    assert after["t1"] - before["t1"] == after["t2"] - before["t2"] == AMOUNT // 2
    assert after["sponsor"] - before["sponsor"] == AMOUNT % 2


def test_encode_from_node_receipt_equals_getreceipt_abi(sealed_run: SealedRun) -> None:
    assert encode_receipt(sealed_run.receipt).hex() == sealed_run.service.get_receipt(sealed_run.task_id)["abi"][2:]
