"""TenzroRewardEscrow on a py-evm chain with TRAINING_VERIFY: a real sealed receipt credits every
trainer floor(amount * weight / totalWeight) exactly once (dust to the sponsor), paid out by
``withdraw``; every tampered, unsealed, mismatched, repeated or malformed claim fails and leaves
all balances and credits unchanged. Deposits are keyed by (depositor, taskId)."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path
from typing import Any

import eth_abi
import pytest
from eth_account import Account
from eth_utils import keccak
from web3 import Web3
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

    def accounts(self) -> dict[str, str]:
        who = {"sponsor": Account.from_key(SPONSOR.key).address, "stranger": Account.from_key(STRANGER.key).address}
        who.update({f"t{i}": Account.from_key(t.key).address for i, t in enumerate(self.run.trainers)})
        return who

    def balances(self) -> dict[str, int]:
        who = {"escrow": self.escrow.address, **self.accounts()}
        return {name: self.token.functions.balanceOf(addr).call() for name, addr in who.items()}

    def owed(self) -> dict[str, int]:
        """What each party could withdraw now (credited by claims)."""
        return {name: self.escrow.functions.owedTo(self.token.address, addr).call()
                for name, addr in self.accounts().items()}

    def withdraw_all(self, key: bytes = STRANGER.key) -> None:
        """Push every credit out (anyone may call withdraw for anyone)."""
        for name, addr in self.accounts().items():
            if self.escrow.functions.owedTo(self.token.address, addr).call():
                fn = self.escrow.functions.withdraw(self.token.address, addr)
                assert self.chain.send(fn, key).status == 1, name

    def settle(self, receipt: bytes, root: bytes, key: bytes = STRANGER.key) -> Any:
        """Claim, then withdraw every credit; returns the claim's receipt."""
        rc = self.claim(receipt, root, key)
        if rc.status == 1:
            self.withdraw_all()
        return rc

    def key_of(self, task_id: str, sponsor_key: bytes = SPONSOR.key) -> bytes:
        return bytes(self.escrow.functions.depositKeyOf(Account.from_key(sponsor_key).address, task_id).call())

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


def make_setup(chain: Chain, run: SealedRun, token_contract: str = "TestToken") -> Setup:
    for key in (SPONSOR.key, STRANGER.key):
        chain.fund(Account.from_key(key).address)
    token = chain.deploy(token_contract, "Test", "TST", key=SPONSOR.key)
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
    assert setup.balances() == before  # a claim only credits: nothing moves until withdraw
    pay, dust = expected_payouts(run, AMOUNT)
    assert dust == 2  # floor((10**18 + 7) * [4, 4, 2] / 10) sums to 10**18 + 5
    assert setup.owed() == {**pay, "sponsor": dust, "stranger": 0}
    credited = setup.escrow.events.Credited().process_receipt(receipt, errors=DISCARD)
    assert sorted(e.args.amount for e in credited) == sorted(pay.values())
    (claimed,) = setup.escrow.events.Claimed().process_receipt(receipt, errors=DISCARD)
    assert claimed.args.paid == AMOUNT - dust and claimed.args.dust == dust and claimed.args.payees == 3
    assert claimed.args.runRoot == run.run_root
    key = setup.key_of(run.task_id)
    assert claimed.args.depositKey == key
    assert setup.escrow.functions.depositOf(key).call()[2] == 2  # Claimed
    setup.withdraw_all()
    after = setup.balances()
    for name, amount in pay.items():
        assert after[name] - before[name] == amount
    assert after["sponsor"] - before["sponsor"] == dust
    assert after["escrow"] == 0 and after["stranger"] == before["stranger"]  # the caller gets nothing
    assert set(setup.owed().values()) == {0}
    print(f"claim gas (3 trainers): {receipt.gasUsed}")


def test_deposit_key_is_keccak_of_abi_encoded_sponsor_and_task_id(setup: Setup) -> None:
    sponsor = Account.from_key(SPONSOR.key).address
    task_id = setup.run.task_id
    assert setup.key_of(task_id) == keccak(eth_abi.encode(["address", "string"], [sponsor, task_id]))
    (sponsor_got, deadline, status, token, amount) = setup.escrow.functions.depositOf(setup.key_of(task_id)).call()
    assert (sponsor_got, deadline, status, token, amount) == (sponsor, DEADLINE, 1, setup.token.address, AMOUNT)
    assert setup.escrow.functions.depositOf(keccak(text=task_id)).call()[2] == 0  # the old key holds nothing


def test_payouts_equal_the_nodes_own_split(chain: Chain, sealed_run: SealedRun) -> None:
    # With the escrowed amount equal to the spec's pool, the chain pays what the node's ledger paid.
    s = make_setup(chain, sealed_run)
    pool = sealed_run.receipt.spec.reward_pool
    assert s.deposit(sealed_run.task_id, amount=pool).status == 1
    before = s.balances()
    assert s.settle(sealed_run.abi, sealed_run.run_root).status == 1
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
    before, owed = setup.balances(), setup.owed()
    assert setup.claim(data, root).status == 0
    assert setup.balances() == before and setup.owed() == owed
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
    before, owed = setup.balances(), setup.owed()
    assert setup.claim(run.abi, run.run_root).status == 0
    assert setup.balances() == before and setup.owed() == owed
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
    assert s.settle(sealed_run.abi, sealed_run.run_root).status == 1
    assert s.balances()["escrow"] == AMOUNT


def test_invalid_claim_when_only_someone_else_deposited(chain: Chain, sealed_run: SealedRun) -> None:
    # A deposit by anyone but the spec's sponsor lives under its depositor's key; the claim reads
    # only the receipt sponsor's deposit, so there is nothing to claim.
    s = make_setup(chain, sealed_run)
    assert s.deposit(sealed_run.task_id, key=STRANGER.key).status == 1
    before = s.balances()
    assert s.claim(sealed_run.abi, sealed_run.run_root).status == 0
    assert s.balances() == before
    assert s.revert_name(s.escrow.functions.claim(sealed_run.abi, sealed_run.run_root)) == "NotOpen"


def test_invalid_deposit_squat_cannot_lock_out_the_sponsor(chain: Chain, sealed_run: SealedRun) -> None:
    # The reviewer's squat: a stranger who saw the task id deposits 1 unit first, with the
    # largest deadline. Keyed by (depositor, taskId), it blocks nothing.
    s = make_setup(chain, sealed_run)
    task_id = sealed_run.task_id
    squat = s.deposit(task_id, amount=1, key=STRANGER.key, deadline=2**64 - 1)
    assert squat.status == 1
    assert s.key_of(task_id, STRANGER.key) != s.key_of(task_id)
    assert s.deposit(task_id).status == 1  # the real sponsor's deposit goes through
    before = s.balances()
    assert s.settle(sealed_run.abi, sealed_run.run_root).status == 1
    after = s.balances()
    pay, dust = expected_payouts(sealed_run, AMOUNT)
    assert {n: after[n] - before[n] for n in pay} == pay
    assert after["sponsor"] - before["sponsor"] == dust
    assert after["escrow"] == 1  # only the squat is left
    squat_key = s.key_of(task_id, STRANGER.key)
    assert s.escrow.functions.depositOf(squat_key).call()[2] == 1  # still Open, untouched by the claim
    # The squatter refunds only its own deposit, and only after its own deadline.
    refund = s.escrow.functions.refund(task_id)
    assert s.revert_name(refund, STRANGER.key) == "DeadlineNotReached"
    s.chain.mine_at(DEADLINE + 1)
    assert s.revert_name(refund, SPONSOR.key) == "NotOpen"  # the sponsor's deposit is Claimed
    assert s.revert_name(refund, STRANGER.key) == "DeadlineNotReached"  # 2**64 - 1 is its deadline
    assert s.balances()["escrow"] == 1


def test_squatter_refunds_its_own_deposit_after_its_deadline(chain: Chain, sealed_run: SealedRun) -> None:
    s = make_setup(chain, sealed_run)
    task_id = sealed_run.task_id
    assert s.deposit(task_id, amount=5, key=STRANGER.key).status == 1
    assert s.deposit(task_id).status == 1
    s.chain.mine_at(DEADLINE + 1)
    before = s.balances()
    assert s.chain.send(s.escrow.functions.refund(task_id), STRANGER.key).status == 1
    after = s.balances()
    assert after["stranger"] - before["stranger"] == 5 and after["sponsor"] == before["sponsor"]
    assert after["escrow"] == AMOUNT  # the sponsor's deposit is untouched, and still claimable
    assert s.settle(sealed_run.abi, sealed_run.run_root).status == 1
    assert s.balances()["escrow"] == 0


def test_refund_after_deadline_then_claim_fails(setup: Setup) -> None:
    run = setup.run
    sponsor = SPONSOR.key
    refund = setup.escrow.functions.refund(run.task_id)
    assert setup.revert_name(refund, sponsor) == "DeadlineNotReached"
    assert setup.chain.send(refund, sponsor).status == 0
    setup.chain.mine_at(DEADLINE + 1)
    assert setup.revert_name(refund, STRANGER.key) == "NotOpen"  # the stranger has no deposit of its own
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
    assert s.settle(run.abi, run.run_root).status == 1
    after = s.balances()
    assert after["t0"] == before["t0"]
    assert after["t1"] - before["t1"] == after["t2"] - before["t2"] == AMOUNT // 2
    assert after["sponsor"] - before["sponsor"] == AMOUNT % 2


# --- withdraw (pull payments) -----------------------------------------------------------------


def test_a_payee_whose_transfer_reverts_blocks_nobody_else(chain: Chain, sealed_run: SealedRun) -> None:
    # Fault injection: the token refuses transfers to t0 (a blacklist). The claim still credits
    # everyone; the others withdraw; t0's withdraw fails and keeps its credit until unblocked.
    s = make_setup(chain, sealed_run, token_contract="BlockingTestToken")
    assert s.deposit(sealed_run.task_id).status == 1
    t0 = s.accounts()["t0"]
    assert chain.send(s.token.functions.setBlocked(t0, True), STRANGER.key).status == 1
    before = s.balances()
    assert s.claim(sealed_run.abi, sealed_run.run_root).status == 1
    pay, dust = expected_payouts(sealed_run, AMOUNT)
    for name in ("t1", "t2", "sponsor"):
        assert chain.send(s.escrow.functions.withdraw(s.token.address, s.accounts()[name]), STRANGER.key).status == 1
    blocked = s.escrow.functions.withdraw(s.token.address, t0)
    assert chain.send(blocked, STRANGER.key).status == 0
    after = s.balances()
    assert after["t0"] == before["t0"] and s.owed()["t0"] == pay["t0"]
    assert after["t1"] - before["t1"] == pay["t1"] and after["t2"] - before["t2"] == pay["t2"]
    assert after["sponsor"] - before["sponsor"] == dust and after["escrow"] == pay["t0"]
    assert chain.send(s.token.functions.setBlocked(t0, False), STRANGER.key).status == 1
    receipt = chain.send(blocked, STRANGER.key)
    assert receipt.status == 1
    (event,) = s.escrow.events.Withdrawn().process_receipt(receipt, errors=DISCARD)
    assert (event.args.account, event.args.token, event.args.amount) == (t0, s.token.address, pay["t0"])
    assert s.balances()["t0"] - before["t0"] == pay["t0"] and s.balances()["escrow"] == 0


def test_a_token_charging_the_sender_on_top_cannot_pay_out_of_other_deposits(chain: Chain, sealed_run: SealedRun) -> None:
    # Contracts probe (stop 20): with a token that takes 1% from the sender ON TOP of the amount,
    # each withdraw took owed + 1% from the escrow's one balance, i.e. out of another
    # depositor's tokens, and the last payee or refund found the escrow short. Now a payout
    # that does not take exactly what it pays reverts, and nothing moves.
    s = make_setup(chain, sealed_run, token_contract="SurchargeTestToken")
    assert s.deposit(sealed_run.task_id).status == 1
    assert s.deposit("another-task", key=STRANGER.key).status == 1  # the bystander's deposit
    assert s.balances()["escrow"] == 2 * AMOUNT  # deposits are measured, and exact here
    assert s.claim(sealed_run.abi, sealed_run.run_root).status == 1
    t0 = s.accounts()["t0"]
    owed = s.owed()["t0"]
    before = s.balances()
    withdraw = s.escrow.functions.withdraw(s.token.address, t0)
    assert s.revert_name(withdraw) == "TransferMismatch"
    assert chain.send(withdraw, STRANGER.key).status == 0
    assert s.balances() == before and s.owed()["t0"] == owed  # the credit is kept
    # The bystander's refund after its deadline is refused the same way: its deposit is not
    # paid at a discount out of the claimed one either.
    chain.mine_at(DEADLINE + 1)
    refund = s.escrow.functions.refund("another-task")
    assert chain.send(refund, STRANGER.key).status == 0  # mined past the deadline
    assert s.revert_name(refund, STRANGER.key) == "TransferMismatch"
    assert s.balances()["escrow"] == 2 * AMOUNT


def test_a_token_that_rounds_transfers_down_still_pays_out(chain: Chain, sealed_run: SealedRun) -> None:
    # Review (stop 20): share-based tokens move a transfer's amount give or take a wei; a payout
    # that takes LESS than it pays harms no other deposit and must not be refused.
    s = make_setup(chain, sealed_run, token_contract="RoundingTestToken")
    assert s.deposit(sealed_run.task_id).status == 1
    assert s.balances()["escrow"] == AMOUNT - 1  # what arrived is what is held
    assert s.claim(sealed_run.abi, sealed_run.run_root).status == 1
    before = s.balances()
    t0 = s.accounts()["t0"]
    owed = s.owed()["t0"]
    assert chain.send(s.escrow.functions.withdraw(s.token.address, t0), STRANGER.key).status == 1
    after = s.balances()
    assert after["t0"] - before["t0"] == owed - 1 and before["escrow"] - after["escrow"] == owed - 1


def test_invalid_withdraw_of_nothing_and_twice(setup: Setup) -> None:
    run = setup.run
    t0 = setup.accounts()["t0"]
    withdraw = setup.escrow.functions.withdraw(setup.token.address, t0)
    assert setup.revert_name(withdraw) == "NothingOwed"  # before the claim
    assert setup.claim(run.abi, run.run_root).status == 1
    assert setup.chain.send(withdraw, STRANGER.key).status == 1
    before = setup.balances()
    assert setup.revert_name(withdraw) == "NothingOwed"
    assert setup.chain.send(withdraw, STRANGER.key).status == 0
    assert setup.balances() == before


def test_encode_from_node_receipt_equals_getreceipt_abi(sealed_run: SealedRun) -> None:
    assert encode_receipt(sealed_run.receipt).hex() == sealed_run.service.get_receipt(sealed_run.task_id)["abi"][2:]


@pytest.mark.parametrize(("fragments", "trainers"), [(12, 8), (2, 64), (1, 256)])
def test_the_largest_receipt_a_default_node_admits_is_claimable_in_one_block(
    chain: Chain, sealed_run: SealedRun, fragments: int, trainers: int
) -> None:
    """A run a default node accepts must be payable: the worst-case receipt of the longest run
    of this shape that ``max_receipt_bytes`` admits is claimed, every trainer credited, inside a
    30M-gas block. 12 x 8 is the example spec's shape; 2 x 64 makes the receipt mostly accepted
    addresses, its densest non-zero bytes (EIP-7623 prices calldata by them); 1 x 256 has the
    most payees ``max_trainer_count`` admits (each credit costs ~36K gas). Before the limits a
    node accepted the example's 1,024 rounds (past ~105 no claim fit a block) and any number of
    trainers (past ~900 none did)."""
    from tenzro_training.node.config import DEFAULT_MAX_TRAINER_COUNT

    assert trainers <= DEFAULT_MAX_TRAINER_COUNT
    from precompile import SealedReceipt, compute_sealed_receipt
    from tenzro_training.node.config import DEFAULT_MAX_RECEIPT_BYTES
    from tenzro_training.receipt_abi import compute_receipt_size_bound
    from tests.synthetic_receipts import synthetic_receipt, synthetic_spec

    def spec_of(rounds: int) -> Any:
        return synthetic_spec(rounds, fragments, trainers, task_id="largest-admitted", sponsor_address=SPONSOR.text)

    rounds = 1
    while compute_receipt_size_bound(spec_of(rounds + 1)) <= DEFAULT_MAX_RECEIPT_BYTES:
        rounds += 1
    receipt = synthetic_receipt(spec_of(rounds), worst_case=True)
    data = encode_receipt(receipt)
    assert len(data) == compute_receipt_size_bound(receipt.spec) <= DEFAULT_MAX_RECEIPT_BYTES
    s = make_setup(chain, sealed_run)
    record: SealedReceipt = compute_sealed_receipt(receipt)
    chain.sealed.source = lambda task_id: record if task_id == receipt.task_id else None
    assert s.deposit(receipt.task_id).status == 1
    block_gas = chain.w3.eth.get_block("latest").gasLimit
    assert block_gas >= 30_000_000
    rc = chain.send(s.escrow.functions.claim(data, receipt.run_root), STRANGER.key, gas=30_000_000)
    assert rc.status == 1
    credited = [s.escrow.functions.owedTo(s.token.address, Web3.to_checksum_address(t.address)).call()
                for t in receipt.trainers]
    assert all(c > 0 for c in credited) and sum(credited) <= AMOUNT
    print(f"largest admitted receipt ({fragments} x {trainers}): {rounds} rounds, {len(data)} bytes, "
          f"claim gas {rc.gasUsed}")
