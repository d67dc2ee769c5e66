"""TRAINING_VERIFY at 0x1008 inside py-evm: the sealed receipt of a real node run verifies,
anything else (including a VALID receipt that differs from the sealed bytes only in fields the
run root does not commit) answers 0x00 with a successful call, and 1,000 fuzzed inputs never
crash. The reviewer's slashed-flag forgeries through the escrow are in test_sealed_binding.py."""

from __future__ import annotations

import hashlib
import random
from pathlib import Path

import pytest
from eth_utils import to_checksum_address

from precompile import (
    GAS_BASE,
    GAS_PER_WORD,
    INVALID,
    MAX_INPUT_BYTES,
    VALID,
    SealedReceipt,
    compute_gas,
    compute_sealed_receipt,
    training_verify,
)
from precompile.evm import sealed_lookup_from_store
from storage import schema
from storage.memory import MemoryStore
from tenzro_training.node import persistence
from tenzro_training.receipt_abi import MAX_RECEIPT_BYTES
from tests.chain.conftest import Chain, SealedRun, run_to_sealed

ADDRESS = to_checksum_address("0x" + "00" * 18 + "1008")


def call(chain: Chain, data: bytes, gas: int = 30_000_000) -> bytes:
    return bytes(chain.w3.eth.call({"to": ADDRESS, "data": "0x" + data.hex(), "gas": gas}))


def test_sealed_receipt_verifies_in_the_evm(chain: Chain, sealed_run: SealedRun) -> None:
    data = sealed_run.run_root + sealed_run.abi
    # The answer is always exactly one byte (ITrainingVerify.sol reads it as such): 0x00 / 0x01.
    assert call(chain, data) == INVALID == b"\x00"  # the chain has not seen the seal yet
    chain.sealed.use_store(sealed_run.store)
    assert call(chain, data) == VALID == b"\x01"
    assert training_verify(data, sealed_lookup_from_store(sealed_run.store)) == VALID
    # The reference takes any bytes-like input, as its callers hold it (a buffer, a view).
    for view in (bytearray(data), memoryview(data)):
        assert training_verify(view, sealed_lookup_from_store(sealed_run.store)) == VALID


def test_node_get_receipt_abi_is_the_verified_bytes(sealed_run: SealedRun) -> None:
    answer = sealed_run.service.get_receipt(sealed_run.task_id)
    assert answer["abi"] == "0x" + sealed_run.abi.hex()
    assert answer["run_root"] == "0x" + sealed_run.run_root.hex()


def test_invalid_root_not_held_by_the_chain(chain: Chain, sealed_run: SealedRun) -> None:
    other = SealedReceipt(bytes(31) + b"\x01", compute_sealed_receipt(sealed_run.receipt).receipt_digest)
    chain.sealed.source = lambda task_id: other if task_id == sealed_run.task_id else None
    assert call(chain, sealed_run.run_root + sealed_run.abi) == INVALID


def test_invalid_digest_not_held_by_the_chain(chain: Chain, sealed_run: SealedRun) -> None:
    # The right root but another receipt's digest: the bytes are not the ones the chain sealed.
    other = SealedReceipt(sealed_run.run_root, bytes(32))
    chain.sealed.source = lambda task_id: other if task_id == sealed_run.task_id else None
    assert call(chain, sealed_run.run_root + sealed_run.abi) == INVALID


def test_invalid_self_consistent_receipt_of_an_unsealed_run(chain: Chain, sealed_run: SealedRun, tmp_path: Path) -> None:
    # A perfectly valid receipt of another run: only the chain's seal is missing.
    other = run_to_sealed(tmp_path, task_id="never-sealed", n_trainers=2, rounds=1)
    chain.sealed.use_store(sealed_run.store)
    assert call(chain, other.run_root + other.abi) == INVALID
    chain.sealed.use_store(other.store)  # positive control: the same bytes, now sealed
    assert call(chain, other.run_root + other.abi) == VALID


def test_invalid_tampered_inputs(chain: Chain, sealed_run: SealedRun) -> None:
    chain.sealed.use_store(sealed_run.store)
    root, abi = sealed_run.run_root, sealed_run.abi
    spec_at = abi.find(sealed_run.receipt.spec.canonical_bytes())
    assert spec_at > 0
    cases = [
        b"",
        root,
        root[:31],
        root + abi[:-1],
        root + abi + b"\x00",
        bytes([root[0] ^ 1]) + root[1:] + abi,
        root + abi[: spec_at + 10] + bytes([abi[spec_at + 10] ^ 0x20]) + abi[spec_at + 11 :],
        abi,  # the root missing
    ]
    for data in cases:
        assert call(chain, data) == INVALID
        assert training_verify(data, sealed_lookup_from_store(sealed_run.store)) == INVALID


def test_gas_schedule(chain: Chain, sealed_run: SealedRun) -> None:
    # The published figures (docs/receipt.md "Gas schedule"): claim budgets and the contracts'
    # gas tests are sized by them, so a changed constant must fail here, not only move along.
    assert (GAS_BASE, GAS_PER_WORD) == (3000, 42)
    assert [compute_gas(n) for n in (0, 1, 32, 33, 64, 65)] == [3000, 3042, 3042, 3084, 3084, 3126]
    assert compute_gas(0) == GAS_BASE
    assert compute_gas(1) == compute_gas(32) == GAS_BASE + GAS_PER_WORD
    assert compute_gas(33) == GAS_BASE + 2 * GAS_PER_WORD
    with pytest.raises(ValueError):
        compute_gas(-1)
    data = sealed_run.run_root + sealed_run.abi
    estimate = chain.w3.eth.estimate_gas({"to": ADDRESS, "data": "0x" + data.hex()})
    assert estimate >= 21_000 + compute_gas(len(data))


def test_input_of_the_largest_receipt_is_looked_up_and_one_byte_more_is_refused_unparsed(
    sealed_run: SealedRun,
) -> None:
    """MAX_INPUT_BYTES is 32 + MAX_RECEIPT_BYTES: any receipt a node can seal must reach the
    sealed-record lookup (a smaller limit would leave the largest runs unpayable), and anything
    longer is refused before a byte of it is read (it only pays its gas)."""
    asked: list[str] = []

    def lookup(task_id: str) -> SealedReceipt | None:
        asked.append(task_id)
        return None

    data = sealed_run.run_root + sealed_run.abi
    at_limit = data + bytes(32 + MAX_RECEIPT_BYTES - len(data))  # trailing bytes: the head still names the task
    assert training_verify(at_limit, lookup) == INVALID  # not the sealed bytes
    assert asked == [sealed_run.task_id]
    assert training_verify(at_limit + b"\x00", lookup) == INVALID
    assert asked == [sealed_run.task_id]  # refused unparsed: no lookup


def test_invalid_out_of_gas_fails_the_call(chain: Chain) -> None:
    # 64 zero bytes: intrinsic 21,000 + 4 per zero byte (above Prague's calldata floor), then
    # exactly compute_gas(64) for the precompile; one gas less and the call fails.
    data = bytes(64)
    exact = 21_000 + 4 * len(data) + compute_gas(len(data))
    assert call(chain, data, gas=exact) == INVALID  # ran, and answered "not valid"
    try:  # eth-tester raises or answers empty output: either way the call failed
        out = call(chain, data, gas=exact - 1)
    except Exception:  # noqa: BLE001
        out = None
    assert out in (None, b"")


def test_reference_never_raises() -> None:
    def boom(task_id: str) -> SealedReceipt | None:
        raise RuntimeError("lookup failed")

    assert training_verify(b"\x00" * 64, boom) == INVALID
    assert training_verify("not bytes", lambda t: None) == INVALID  # type: ignore[arg-type]
    assert training_verify(b"\x00" * (MAX_INPUT_BYTES + 1), lambda t: None) == INVALID


def test_reference_with_a_raising_lookup_on_a_valid_receipt(sealed_run: SealedRun) -> None:
    def boom(task_id: str) -> SealedReceipt | None:
        raise MemoryError

    data = sealed_run.run_root + sealed_run.abi
    assert training_verify(data, boom) == INVALID
    assert training_verify(data, lambda t: bytearray(sealed_run.run_root)) == INVALID  # type: ignore[arg-type,return-value]
    assert training_verify(data, lambda t: sealed_run.run_root) == INVALID  # type: ignore[arg-type,return-value]


def test_the_validity_rules_run_only_on_sealed_bytes_and_once(
    sealed_run: SealedRun, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Contracts probe (stop 20): the rules (spec parse, Merkle root, re-encoding) ran before the
    digest check, so forged megabytes cost the node's Python the whole rule set for the flat
    per-word gas, and a contract looping over one sealed receipt paid it on every call."""
    import precompile.verify as verify

    runs: list[bytes] = []
    real = verify.verify_receipt_bytes

    def counting(root: bytes, body: bytes) -> object:
        runs.append(body)
        return real(root, body)

    monkeypatch.setattr(verify, "verify_receipt_bytes", counting)
    verify.clear_validity_memo()
    lookup = sealed_lookup_from_store(sealed_run.store)
    other = run_to_sealed(tmp_path, task_id="never-sealed", n_trainers=2, rounds=1)
    assert training_verify(other.run_root + other.abi, lookup) == INVALID  # valid, not sealed here
    forged = bytearray(sealed_run.abi)
    forged[-1] ^= 1  # sealedAt changed: the same task, other bytes
    assert training_verify(sealed_run.run_root + bytes(forged), lookup) == INVALID
    assert runs == []  # neither reached the rules
    data = sealed_run.run_root + sealed_run.abi
    assert [training_verify(data, lookup) for _ in range(3)] == [VALID] * 3
    assert runs == [sealed_run.abi]  # once, then remembered
    # A lookup whose record names bytes that break the rules (no honest chain has one): the
    # answer is INVALID, and it is NOT remembered (a failure may be transient: a MemoryError
    # in the rules also answers INVALID).
    bad = bytearray(sealed_run.abi)
    spec_at = bytes(bad).find(sealed_run.receipt.spec.canonical_bytes())
    bad[spec_at + 10] ^= 0x20
    record = SealedReceipt(sealed_run.run_root, hashlib.sha256(bytes(bad)).digest())
    assert [training_verify(sealed_run.run_root + bytes(bad), lambda t: record) for _ in range(2)] == [INVALID] * 2
    assert runs == [sealed_run.abi, bytes(bad), bytes(bad)]


def test_the_validity_memo_keeps_the_256_most_recently_used_receipts(
    sealed_run: SealedRun, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The memo is bounded (docs/receipt.md: 256 receipts) so a caller cannot grow the node's
    memory with sealed receipts, and least-recently-used, so a receipt a contract keeps
    verifying stays cheap while others come and go."""
    import precompile.verify as verify

    runs: list[bytes] = []

    def counting(root: bytes, body: bytes) -> object:
        runs.append(body)
        return object()  # the rules themselves are not under test: every body passes

    monkeypatch.setattr(verify, "verify_receipt_bytes", counting)
    verify.clear_validity_memo()
    # 257 distinct bodies naming the same task (trailing bytes change the digest, not the head).
    bodies = [sealed_run.abi + i.to_bytes(2, "big") for i in range(257)]

    def check(body: bytes) -> None:
        record = SealedReceipt(sealed_run.run_root, hashlib.sha256(body).digest())
        assert training_verify(sealed_run.run_root + body, lambda t: record) == VALID

    for body in bodies[:256]:
        check(body)
    check(bodies[0])  # remembered, and now the most recently used
    check(bodies[256])  # the 257th evicts the least recently used: bodies[1]
    assert runs == bodies
    check(bodies[0])
    check(bodies[2])
    assert runs == bodies  # both still remembered
    check(bodies[1])
    assert runs == [*bodies, bodies[1]]  # evicted, so checked again
    verify.clear_validity_memo()


def test_sealed_lookup_from_store(sealed_run: SealedRun) -> None:
    lookup = sealed_lookup_from_store(sealed_run.store)
    assert lookup(sealed_run.task_id) == compute_sealed_receipt(sealed_run.receipt)
    assert lookup(sealed_run.task_id).run_root == sealed_run.run_root  # type: ignore[union-attr]
    assert lookup("unknown-task") is None
    assert lookup("not a task id!") is None
    broken = MemoryStore()
    with broken.atomic_batch() as batch:
        batch.put(schema.CF_META, schema.sealed_record_key("x"), b"\x01" * 63)
    assert sealed_lookup_from_store(broken)("x") is None
    # Task ids are case-sensitive: "Run-A" and "run-a" are two runs, and each has its own seal.
    mixed = MemoryStore()
    with mixed.atomic_batch() as batch:
        batch.put(schema.CF_META, schema.sealed_record_key("Run-A"), persistence.encode_sealed_record(sealed_run.receipt))
    assert sealed_lookup_from_store(mixed)("Run-A") == compute_sealed_receipt(sealed_run.receipt)
    assert sealed_lookup_from_store(mixed)("run-a") is None


class _CountingStore(MemoryStore):
    """A MemoryStore that records every (family, key) read."""

    def __init__(self) -> None:
        super().__init__()
        self.reads: list[tuple[str, bytes]] = []

    def get(self, cf: str, key: bytes) -> bytes | None:
        self.reads.append((cf, key))
        return super().get(cf, key)


def test_sealed_lookup_reads_one_small_record_not_the_receipt(sealed_run: SealedRun) -> None:
    """The lookup is priced as one state read inside GAS_BASE: it must not decode and re-encode
    the stored receipt (megabytes for a long run) on every call, as it did."""
    store = _CountingStore()
    with store.atomic_batch() as batch:
        for cf in (schema.CF_META, schema.CF_TRAINING_RECEIPTS):
            for key, value in sealed_run.store.iterate(cf):
                batch.put(cf, key, value)
    lookup = sealed_lookup_from_store(store)
    store.reads.clear()
    assert lookup(sealed_run.task_id) == compute_sealed_receipt(sealed_run.receipt)
    assert store.reads == [(schema.CF_META, schema.sealed_record_key(sealed_run.task_id))]
    # Without its record a receipt does not count as sealed (a node writes the record with the
    # seal, and for an older store at startup: tests/node/test_service.py).
    with store.atomic_batch() as batch:
        batch.delete(schema.CF_META, schema.sealed_record_key(sealed_run.task_id))
    assert lookup(sealed_run.task_id) is None


def test_without_the_evm_extra_the_import_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    """py-evm and eth-tester come with the ``evm`` extra only: a plain install that imports
    precompile.evm must be told what to install, not fail later on an undefined name."""
    import importlib
    import sys

    monkeypatch.delitem(sys.modules, "precompile.evm")
    monkeypatch.setitem(sys.modules, "eth_tester", None)  # as if not installed
    with pytest.raises(ModuleNotFoundError, match=r"pip install 'tenzro-training\[evm\]'") as info:
        importlib.import_module("precompile.evm")
    assert info.value.name == "eth_tester"


def test_fuzzed_inputs_never_crash(chain: Chain, sealed_run: SealedRun) -> None:
    chain.sealed.use_store(sealed_run.store)
    lookup = sealed_lookup_from_store(sealed_run.store)
    valid = sealed_run.run_root + sealed_run.abi
    rng = random.Random(20240607)
    outputs = {VALID: 0, INVALID: 0}
    for n in range(1000):
        kind = n % 4
        if kind == 0:  # random bytes of random length
            data = rng.randbytes(rng.choice([0, 1, 31, 32, 33, 64, rng.randrange(0, 4096)]))
        elif kind == 1:  # a few bytes of the valid input changed
            raw = bytearray(valid)
            for _ in range(rng.randint(1, 3)):
                raw[rng.randrange(len(raw))] = rng.randrange(256)
            data = bytes(raw)
        elif kind == 2:  # truncated or extended
            cut = rng.randrange(len(valid) + 64)
            data = valid[:cut] if cut <= len(valid) else valid + rng.randbytes(cut - len(valid))
        else:  # a random 32-byte word overwritten (offsets, lengths, counts)
            raw = bytearray(valid)
            at = 32 * rng.randrange(len(raw) // 32)
            raw[at : at + 32] = rng.choice([rng.randbytes(32), (2**256 - 1).to_bytes(32, "big"),
                                            rng.randrange(1 << 24).to_bytes(32, "big")])
            data = bytes(raw)
        out = call(chain, data)
        assert out in (VALID, INVALID)
        assert out == training_verify(data, lookup)
        # Only the sealed bytes themselves verify: a mutation of an uncommitted field (stake,
        # DID, sealedAt, a slashed flag) may pass the validity rules but not the sealed digest.
        assert out == INVALID or data == valid
        outputs[out] += 1
    assert outputs[INVALID] > 900
