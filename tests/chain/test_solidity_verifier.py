"""The pure-Solidity TrainingReceiptVerifier on py-evm agrees with receipt_abi.verify_receipt_bytes.

Receipts come from a real sealed run (tests/test_receipt.py's ``sealed_env``, with and without a
syncer failover) and from a builder that makes R-round receipts with several rules, slashed
trainers and a syncer change. Every tampered variant is checked by BOTH verifiers and they must
give the same answer; most variants must be rejected (those that only touch uncommitted fields,
e.g. a stake, sealedAt or a zero-weight trainer's slashed flag, stay STRUCTURALLY valid in both:
this verifier checks structure only and cannot gate a payout by itself; TRAINING_VERIFY, which
binds the sealed bytes, refuses them, as a test below checks on a real sealed run). Inclusion
proofs of every round of an 8-round run verify on chain and fail for a wrong index, record, size
or proof.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import json
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import eth_abi
import pytest
from web3 import Web3

from precompile import INVALID, VALID, training_verify
from precompile.evm import make_web3, sealed_lookup_from_store

from tenzro_training.merkle import inclusion_proofs, merkle_root, run_root, verify_inclusion
from tenzro_training.receipt import (
    ReceiptTrainer,
    TrainingReceipt,
    compute_accepted_counts,
    compute_receipt,
    verify_receipt_root,
)
from tenzro_training.receipt_abi import RECEIPT_ABI_TYPE, _abi_value, encode_receipt, verify_receipt_bytes
from tenzro_training.records import (
    FINAL_MODEL_RECORD_ABI_TYPES,
    ROUND_RECORD_ABI_TYPES,
    FragmentOutcome,
    RoundRecord,
    compute_run_leaves,
    encode_round_record,
)
from tenzro_training.rules import RuleKind
from tenzro_training.spec import TrainingTaskSpec
from tests.chain.conftest import SwitchableLookup, rewritten_receipt, run_to_sealed

ROOT = Path(__file__).resolve().parents[2]
GAS = 30_000_000
TRAINERS = sorted(bytes([0x31 + 7 * i]) * 19 + bytes([i]) for i in range(6))
SYNCERS = [bytes([0xC0 + i]) * 20 for i in range(3)]
SPEC_DOC: dict[str, Any] = json.loads((ROOT / "tenzro_training/data/timesfm-200m-task.json").read_text())


def h(label: str) -> bytes:
    return hashlib.sha256(label.encode()).digest()


# --- chain ------------------------------------------------------------------------------------


def _load_build() -> Any:
    """contracts/build.py (the shared cached solc-js build); registered in sys.modules because
    its dataclasses resolve their string annotations through it."""
    name = "tenzro_contracts_build"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, ROOT / "contracts" / "build.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def verifier() -> Any:
    """The wrapper deployed on the shared py-evm chain (TRAINING_VERIFY registered at 0x1008,
    which this verifier never calls)."""
    artifact = _load_build().compile_contracts(("TrainingReceiptVerifier.sol",))["TrainingReceiptVerifierContract"]
    w3 = make_web3(SwitchableLookup())
    factory = w3.eth.contract(abi=artifact.abi, bytecode=artifact.bytecode)
    tx = factory.constructor().transact({"from": w3.eth.accounts[0], "gas": 10_000_000})
    address = w3.eth.wait_for_transaction_receipt(tx).contractAddress
    return w3.eth.contract(address=address, abi=artifact.abi)


def sol_verify(verifier: Any, root: bytes, data: bytes) -> bool:
    return bool(verifier.functions.verify(root, data).call({"gas": GAS}))


def py_verify(root: bytes, data: bytes) -> bool:
    return verify_receipt_bytes(root, data) is not None


# --- receipts ---------------------------------------------------------------------------------


def make_spec(rounds: int, aggregation: Any = "Mean", quorum: int = 3, **overrides: Any) -> TrainingTaskSpec:
    doc = json.loads(json.dumps(SPEC_DOC))
    doc.update(max_rounds=rounds, aggregation=aggregation, trainer_count=6, quorum=quorum)
    doc["architecture"]["fragment_count"] = 2
    for key, value in overrides.items():
        if key == "metadata":
            doc["architecture"]["metadata"] = value
        else:
            doc[key] = value
    return TrainingTaskSpec.from_dict(doc, supported_only=False)


def _outcome(rule: RuleKind, param: int, accepted: list[bytes], label: str) -> FragmentOutcome:
    k = len(accepted)
    trimmed = (k * param) // 10000 if rule is RuleKind.TRIMMED_MEAN else 0
    selected = (len(label) % k) if rule is RuleKind.KRUM else 0
    return FragmentOutcome(h("agg" + label), tuple(sorted(accepted)), selected, trimmed, h("rep" + label))


def build_receipt(
    rounds: int,
    *,
    aggregation: Any = "Mean",
    rule: tuple[RuleKind, int] = (RuleKind.MEAN, 0),
    slashed: tuple[int, ...] = (),
    failover_from: int | None = None,
    metadata: dict[str, Any] | None = None,
) -> TrainingReceipt:
    """An R-round receipt: 6 trainers, 2 fragments, accepted sets rotating so weights differ."""
    quorum = 5 if rule[0] is RuleKind.KRUM else 3
    spec = make_spec(rounds, aggregation, quorum, **({} if metadata is None else {"metadata": metadata}))
    records = []
    for r in range(rounds):
        fragments = []
        for f in range(2):
            size = 5 if rule[0] is RuleKind.KRUM else 3 + (r + f) % 3
            accepted = [TRAINERS[(r + f + j) % 6] for j in range(size)]
            fragments.append(_outcome(rule[0], rule[1], accepted, f"{r}/{f}"))
        syncer, rank = (SYNCERS[1], 2) if failover_from is not None and r >= failover_from else (SYNCERS[0], 1)
        records.append(RoundRecord(spec.task_id, r, syncer, rank, rule[0], rule[1], tuple(fragments), h(f"model{r}")))
    transcript = tuple(records)
    counts = compute_accepted_counts(transcript)
    trainers = tuple(
        ReceiptTrainer(f"did:tenzro:node:t{i}", a, 10**18 + i, counts.get(a, 0), i in slashed)
        for i, a in enumerate(reversed(TRAINERS))  # enrollment order is not address order
    )
    final = h(f"model{rounds - 1}")
    leaves = compute_run_leaves(spec.canonical_bytes(), transcript, None) + [
        eth_abi.encode(FINAL_MODEL_RECORD_ABI_TYPES, [2, 1, spec.task_id, rounds, final])
    ]
    syncers = tuple(dict.fromkeys(rec.syncer for rec in transcript))
    return TrainingReceipt(spec.task_id, spec, run_root(leaves), final, transcript, trainers, syncers, 1_761_400_000)


def real_receipt(with_failover: bool) -> TrainingReceipt:
    from tests.test_receipt import sealed_env

    return compute_receipt(sealed_env(with_failover=with_failover).run)


def node_receipt(**kw: Any) -> TrainingReceipt:
    """A receipt from a real NodeService run (tests/chain/conftest.py run_to_sealed)."""
    with tempfile.TemporaryDirectory() as tmp:
        return run_to_sealed(Path(tmp), **kw).receipt


RECEIPTS: dict[str, Callable[[], TrainingReceipt]] = {
    "node-run-unequal": lambda: node_receipt(skip=lambda i, r: i == 2 and r == 1),
    "node-run-slashed": lambda: node_receipt(n_trainers=4, rounds=3, equivocate=3),
    "sealed-run": lambda: real_receipt(False),
    "sealed-run-failover": lambda: real_receipt(True),
    "mean-2": lambda: build_receipt(2),
    "trimmed-3-slashed": lambda: build_receipt(
        3, aggregation={"TrimmedMean": {"alpha_bps": 2500}}, rule=(RuleKind.TRIMMED_MEAN, 2500), slashed=(1, 4)
    ),
    "krum-4-failover": lambda: build_receipt(
        4, aggregation={"Krum": {"f": 1}}, rule=(RuleKind.KRUM, 1), failover_from=2
    ),
    "median-8": lambda: build_receipt(8, aggregation="CoordinateMedian", rule=(RuleKind.COORDINATE_MEDIAN, 0)),
    # A metadata key spelled like the top-level fields: only the top-level ones count.
    "shadow-keys": lambda: build_receipt(
        2, metadata={"task_id": "other", "max_rounds": 7, "quorum": 1, "trainer_count": 99, "fragment_count": 9,
                     "aggregation": "Krum", "z": {"reward_pool": "1", "s": '"task_id":"x"'}}
    ),
}


@pytest.mark.parametrize("name", sorted(RECEIPTS))
def test_valid_receipts_verify_in_solidity_and_python(verifier: Any, name: str) -> None:
    receipt = RECEIPTS[name]()
    data = encode_receipt(receipt)
    assert py_verify(receipt.run_root, data)
    assert sol_verify(verifier, receipt.run_root, data)
    assert verifier.functions.verifyOrRevert(receipt.run_root, data).call({"gas": GAS}) is True


def test_checksum_matches_eip55(verifier: Any) -> None:
    for a in TRAINERS + SYNCERS + [bytes.fromhex("7e5f4552091a69125d5dfcb7b8c2659029395bdf")]:
        assert "0x" + verifier.functions.checksumHex(Web3.to_checksum_address(a)).call() == Web3.to_checksum_address(a)


# --- tampering --------------------------------------------------------------------------------
#
# A variant is (claimed_root, data). "Raw" variants edit the ABI value list directly (bypassing
# encode_receipt's checks), and optionally recompute runRoot from the edited leaves and claim it:
# a self-consistent forgery, so only the semantic rules can catch it.

_V = list[Any]


def encode_value(v: _V) -> bytes:
    return eth_abi.encode([RECEIPT_ABI_TYPE], [tuple(v)])


def reroot(v: _V) -> bytes:
    final = eth_abi.encode(FINAL_MODEL_RECORD_ABI_TYPES, [2, 1, v[1], len(v[7]), v[6]])
    root = run_root([v[2], *v[7], final])
    v[5] = root
    return root


def raw_round(rec: RoundRecord, **changes: Any) -> bytes:
    """A round-record leaf with fields replaced, NOT validated (the encoder would refuse some)."""
    values = {
        "kind": 1, "version": 1, "task_id": rec.task_id, "round": rec.round, "syncer": rec.syncer,
        "syncer_rank": rec.syncer_rank, "rule_kind": int(rec.rule_kind), "rule_param": rec.rule_param,
        "fragments": [(o.aggregate_hash, list(o.accepted), o.selected, o.trimmed, o.report_hash) for o in rec.fragments],
        "model_hash": rec.model_hash,
    }
    values.update(changes)
    return eth_abi.encode(ROUND_RECORD_ABI_TYPES, list(values.values()))


def spec_bytes(receipt: TrainingReceipt, **changes: Any) -> bytes:
    doc = receipt.spec.to_dict()
    doc.update(changes)
    return TrainingTaskSpec.from_dict(doc, supported_only=False).canonical_bytes()


def semantic_variants(receipt: TrainingReceipt) -> Iterator[tuple[str, bytes, bytes]]:
    base = list(_abi_value(receipt))
    root = receipt.run_root
    records = receipt.transcript
    n_rounds = len(records)

    def edit(name: str, fn: Callable[[_V], Any], rooted: bool = True) -> tuple[str, bytes, bytes]:
        v = [list(x) if isinstance(x, list) else x for x in base]
        fn(v)
        claimed = reroot(v) if rooted else root
        return name, claimed, encode_value(v)

    def set_(i: int, value: Any) -> Callable[[_V], None]:
        return lambda v: v.__setitem__(i, value)

    def trainer(i: int, **kw: Any) -> Callable[[_V], None]:
        fields = ("address", "weight", "stake", "did", "slashed")

        def fn(v: _V) -> None:
            row = list(v[8][i])
            for k, value in kw.items():
                row[fields.index(k)] = value
            v[8][i] = tuple(row)

        return fn

    # header fields
    yield edit("version-2", set_(0, 2), rooted=False)
    yield edit("version-0", set_(0, 0), rooted=False)
    yield edit("taskId-other", set_(1, "other-task"))
    yield edit("taskId-bad-chars", set_(1, "bad task"))
    yield edit("sponsor-other", set_(3, b"\x01" * 20))
    yield edit("rewardPool+1", set_(4, base[4] + 1))
    yield edit("rewardPool-0", set_(4, 0))
    yield edit("runRoot-field-only", set_(5, h("x")), rooted=False)
    yield edit("finalModelHash-other", set_(6, h("other model")))
    yield edit("sealedAt-other (uncommitted)", set_(10, base[10] + 1), rooted=False)
    yield "claimed-root-wrong", h("not the root"), encode_value(base)
    yield "claimed-root-zero", b"\x00" * 32, encode_value(base)
    # the spec leaf
    yield edit("spec-task_id-other", set_(2, spec_bytes(receipt, task_id="other-task")))
    yield edit("spec-reward_pool-other", set_(2, spec_bytes(receipt, reward_pool=str(base[4] + 7))))
    yield edit("spec-max_rounds+1", set_(2, spec_bytes(receipt, max_rounds=n_rounds + 1)))
    yield edit("spec-sponsor-other", set_(2, spec_bytes(receipt, sponsor_address="0x" + "ab" * 20)))
    yield edit("spec-sponsor-lowercase", set_(2, receipt.spec.canonical_bytes().replace(
        receipt.spec.sponsor_address.encode(), receipt.spec.sponsor_address.lower().encode())))
    yield edit("spec-metadata-task_id-only", set_(2, spec_bytes(
        receipt, task_id="other-task", architecture={**receipt.spec.to_dict()["architecture"],
                                                      "metadata": {"task_id": receipt.task_id}})))
    yield edit("spec-quorum-M", set_(2, spec_bytes(receipt, quorum=receipt.spec.trainer_count)))
    other_rule = "CoordinateMedian" if receipt.spec.aggregation.to_spec() == "Mean" else "Mean"
    yield edit("spec-aggregation-other", set_(2, spec_bytes(receipt, aggregation=other_rule)))
    yield edit("spec-empty", set_(2, b""))
    yield edit("spec-not-json", set_(2, b"not json"))
    # round records
    yield edit("drop-last-round", lambda v: v[7].pop())
    yield edit("drop-last-round-unrooted", lambda v: v[7].pop(), rooted=False)
    yield edit("drop-first-round", lambda v: v[7].pop(0))
    yield edit("duplicate-round", lambda v: v[7].append(v[7][-1]))
    yield edit("empty-transcript", set_(7, []))
    if n_rounds >= 2:
        yield edit("swap-rounds", lambda v: v[7].__setitem__(slice(0, 2), [v[7][1], v[7][0]]))
    last = records[-1]
    yield edit("record-round-index", lambda v: v[7].__setitem__(-1, raw_round(last, round=last.round + 1)))
    yield edit("record-task-id", lambda v: v[7].__setitem__(-1, raw_round(last, task_id="other-task")))
    yield edit("record-kind-2", lambda v: v[7].__setitem__(-1, raw_round(last, kind=2)))
    yield edit("record-version-2", lambda v: v[7].__setitem__(-1, raw_round(last, version=2)))
    yield edit("record-rank-0", lambda v: v[7].__setitem__(-1, raw_round(last, syncer_rank=0)))
    yield edit("record-rule-4", lambda v: v[7].__setitem__(-1, raw_round(last, rule_kind=4)))
    yield edit("record-param-mean-1", lambda v: v[7].__setitem__(-1, raw_round(last, rule_kind=0, rule_param=1)))
    yield edit("record-trimmed-alpha-10001", lambda v: v[7].__setitem__(-1, raw_round(last, rule_kind=1, rule_param=10001)))
    yield edit("record-krum-f-too-big", lambda v: v[7].__setitem__(-1, raw_round(last, rule_kind=3, rule_param=40)))
    yield edit("record-no-fragments", lambda v: v[7].__setitem__(-1, raw_round(last, fragments=[])))
    frag = last.fragments[0]
    frag_raw = (frag.aggregate_hash, list(frag.accepted), frag.selected, frag.trimmed, frag.report_hash)
    yield edit("record-unsorted-accepted", lambda v: v[7].__setitem__(-1, raw_round(
        last, fragments=[(frag_raw[0], list(reversed(frag_raw[1])), *frag_raw[2:])])))
    yield edit("record-duplicate-accepted", lambda v: v[7].__setitem__(-1, raw_round(
        last, fragments=[(frag_raw[0], [frag_raw[1][0]] * 2, *frag_raw[2:])])))
    yield edit("record-empty-accepted", lambda v: v[7].__setitem__(-1, raw_round(
        last, fragments=[(frag_raw[0], [], *frag_raw[2:])])))
    yield edit("record-trimmed+1", lambda v: v[7].__setitem__(-1, raw_round(
        last, fragments=[(frag_raw[0], frag_raw[1], frag_raw[2], frag_raw[3] + 1, frag_raw[4])])))
    yield edit("record-selected+9", lambda v: v[7].__setitem__(-1, raw_round(
        last, fragments=[(frag_raw[0], frag_raw[1], frag_raw[2] + 9, frag_raw[3], frag_raw[4])])))
    yield edit("record-model-hash", lambda v: v[7].__setitem__(-1, raw_round(last, model_hash=h("m"))))
    yield edit("record-trailing-byte", lambda v: v[7].__setitem__(-1, encode_round_record(last) + b"\x00"))
    yield edit("record-truncated", lambda v: v[7].__setitem__(-1, encode_round_record(last)[:-32]))
    yield edit("record-dirty-kind", lambda v: v[7].__setitem__(-1, b"\x01" + encode_round_record(last)[1:]))
    # trainers
    t = len(base[8])
    yield edit("trainer-weight+1", trainer(0, weight=base[8][0][1] + 1))
    yield edit("trainer-weight-0-not-slashed", trainer(t - 1, weight=0))
    yield edit("trainer-slashed-keeps-weight", trainer(0, slashed=True))
    yield edit("trainer-slashed-weight-0 (uncommitted flag)", trainer(0, slashed=True, weight=0))
    yield edit("trainer-stake (uncommitted)", trainer(0, stake=5))
    yield edit("trainer-did-other (uncommitted)", trainer(0, did="did:tenzro:node:someone-else"))
    yield edit("trainer-did-bad", trainer(0, did="did:tenzro:Node:x"))
    yield edit("trainer-did-empty-id", trainer(0, did="did:tenzro:node:"))
    yield edit("trainer-did-long-kind", trainer(0, did="did:tenzro:" + "a" * 33 + ":x"))
    yield edit("trainer-swap-weights", lambda v: v[8].__setitem__(slice(0, 2), [
        (v[8][0][0], v[8][1][1], *v[8][0][2:]), (v[8][1][0], v[8][0][1], *v[8][1][2:])]))
    yield edit("trainer-swap-order", lambda v: v[8].__setitem__(slice(0, 2), [v[8][1], v[8][0]]))
    yield edit("trainer-swap-addresses", lambda v: v[8].__setitem__(slice(0, 2), [
        (v[8][1][0], *v[8][0][1:]), (v[8][0][0], *v[8][1][1:])]))
    yield edit("trainer-dropped", lambda v: v[8].pop(0))
    yield edit("trainer-duplicated", lambda v: v[8].insert(1, v[8][0]))
    yield edit("trainer-extra-zero (valid)", lambda v: v[8].append((b"\xff" * 20, 0, 1, "did:tenzro:node:x", False)))
    yield edit("trainer-extra-nonzero", lambda v: v[8].append((b"\xff" * 20, 1, 1, "did:tenzro:node:x", False)))
    yield edit("trainers-empty", set_(8, []))
    # syncers
    yield edit("syncers-empty", set_(9, []))
    yield edit("syncers-extra", lambda v: v[9].append(b"\xee" * 20))
    yield edit("syncers-duplicated", lambda v: v[9].append(v[9][0]))
    yield edit("syncers-other", lambda v: v[9].__setitem__(0, b"\xee" * 20))
    if len(base[9]) >= 2:
        yield edit("syncers-reversed", lambda v: v[9].reverse())
    # bytes-level
    data = encode_value(base)
    yield "trailing-zero-word", root, data + b"\x00" * 32
    yield "trailing-byte", root, data + b"\x01"
    yield "truncated", root, data[:-32]
    yield "empty", root, b""
    yield "top-offset-0x40", root, (0x40).to_bytes(32, "big") + b"\x00" * 32 + data[32:]


def byte_flips(receipt: TrainingReceipt, count: int) -> Iterator[tuple[str, bytes, bytes]]:
    """Flip one byte at ``count`` positions spread over the whole encoding (every region)."""
    data = encode_receipt(receipt)
    step = max(1, len(data) // count)
    for pos in range(0, len(data), step):
        for mask in (0x01, 0x80):
            flipped = bytearray(data)
            flipped[pos] ^= mask
            yield f"flip@{pos}^{mask:#x}", receipt.run_root, bytes(flipped)


STILL_VALID = {
    "sealedAt-other (uncommitted)", "trainer-slashed-weight-0 (uncommitted flag)", "trainer-stake (uncommitted)",
    "trainer-did-other (uncommitted)", "trainer-extra-zero (valid)",
}
"""Forgeries that are structurally VALID for both verifiers (the run root does not commit these
fields). A contract that paid on the pure-Solidity verifier's answer alone would pay them; the
precompile refuses them (test_still_valid_forgeries_are_refused_by_training_verify)."""


@pytest.mark.parametrize("name", ["node-run-slashed", "trimmed-3-slashed", "krum-4-failover"])
def test_tampered_receipts_agree_with_python(verifier: Any, name: str) -> None:
    receipt = RECEIPTS[name]()
    variants = list(semantic_variants(receipt)) + list(byte_flips(receipt, 12))
    assert len(variants) >= 50
    semantic = {label for label, _, _ in semantic_variants(receipt)}
    rejected = 0
    disagreements = []
    for label, claimed, data in variants:
        expected = py_verify(claimed, data)
        got = sol_verify(verifier, claimed, data)
        if got != expected:
            disagreements.append((label, expected, got))
        rejected += not expected
        if name == "trimmed-3-slashed" and label in semantic:
            # Every named forgery is invalid except those touching only uncommitted fields.
            assert expected is (label in STILL_VALID), label
    assert disagreements == []
    # Only the "(uncommitted)"/"(valid)" variants and flips inside uncommitted bytes may pass.
    assert rejected >= len(variants) - 12


def test_still_valid_forgeries_are_refused_by_training_verify(tmp_path: Path) -> None:
    # A real sealed node run with a slashed trainer, its store wired to the precompile: every
    # STILL_VALID forgery passes the validity rules (both verifiers) but is not the sealed
    # receipt's bytes, so TRAINING_VERIFY answers 0x00, in the EVM and in the reference.
    run = run_to_sealed(tmp_path, task_id="still-valid", n_trainers=4, rounds=3, equivocate=3)
    lookup = sealed_lookup_from_store(run.store)
    w3 = make_web3(lookup)

    def precompile(data: bytes) -> bytes:
        return bytes(w3.eth.call({"to": Web3.to_checksum_address("0x" + "00" * 18 + "1008"),
                                  "data": "0x" + data.hex(), "gas": GAS}))

    assert precompile(run.run_root + run.abi) == VALID == training_verify(run.run_root + run.abi, lookup)
    seen = set()
    for label, claimed, data in semantic_variants(run.receipt):
        if label not in STILL_VALID:
            continue
        seen.add(label)
        assert py_verify(claimed, data), label
        assert claimed == run.run_root and data != run.abi, label
        assert precompile(claimed + data) == INVALID == training_verify(claimed + data, lookup), label
    assert seen == STILL_VALID


def test_invalid_shadowed_spec_fields_are_rejected(verifier: Any) -> None:
    """Top-level task_id differs; only a nested metadata key carries the receipt's task id."""
    receipt = RECEIPTS["shadow-keys"]()
    v = list(_abi_value(receipt))
    doc = receipt.spec.to_dict()
    doc["task_id"] = "top-level-differs"
    doc["architecture"]["metadata"] = {"task_id": receipt.task_id}
    v[2] = TrainingTaskSpec.from_dict(doc, supported_only=False).canonical_bytes()
    assert b'"task_id":"' + receipt.task_id.encode() + b'"' in v[2]
    claimed = reroot(v)
    data = encode_value(v)
    assert not py_verify(claimed, data)
    assert not sol_verify(verifier, claimed, data)


def test_invalid_undecodable_bytes_give_false_not_revert(verifier: Any) -> None:
    for data in (b"", b"\x00" * 31, b"\xff" * 64, (0x20).to_bytes(32, "big") + b"\xff" * 32 * 11):
        assert verifier.functions.verify(b"\x00" * 32, data).call({"gas": GAS}) is False
        assert not py_verify(b"\x00" * 32, data)


# --- inclusion --------------------------------------------------------------------------------


def test_every_round_inclusion_proof_verifies_on_chain(verifier: Any) -> None:
    receipt = RECEIPTS["median-8"]()
    leaves = compute_run_leaves(receipt.spec.canonical_bytes(), receipt.transcript, receipt.final_record)
    proofs = inclusion_proofs(leaves)
    size = len(leaves)
    root = receipt.run_root
    fn = verifier.functions
    for r in range(len(receipt.transcript)):
        i = r + 1
        assert fn.verifyRoundInclusion(root, leaves[i], i, size, proofs[i]).call({"gas": GAS}) is True
        assert fn.verifyRoundInclusionOrRevert(root, leaves[i], i, size, proofs[i]).call({"gas": GAS}) is True


def test_invalid_inclusion_proofs_fail_on_chain(verifier: Any) -> None:
    receipt = RECEIPTS["median-8"]()
    leaves = compute_run_leaves(receipt.spec.canonical_bytes(), receipt.transcript, receipt.final_record)
    proofs = inclusion_proofs(leaves)
    size = len(leaves)
    root = receipt.run_root

    def on_chain(leaf: bytes, index: int, sz: int, proof: list[bytes], rr: bytes = root) -> bool:
        return bool(verifier.functions.verifyRoundInclusion(rr, leaf, index, sz, proof).call({"gas": GAS}))

    cases = []
    for r in range(len(receipt.transcript)):
        i = r + 1
        p = proofs[i]
        cases += [
            ("wrong-index", leaves[i], i + 1, size, p),
            ("wrong-index-same-parity", leaves[i], (i + 2) % size, size, p),
            ("other-record", leaves[1 + (r + 1) % 8], i, size, p),
            ("wrong-size", leaves[i], i, size + 1, p),
            ("smaller-size", leaves[i], i, size - 1, p),
            ("flipped-proof", leaves[i], i, size, [bytes([p[0][0] ^ 1]) + p[0][1:], *p[1:]]),
            ("short-proof", leaves[i], i, size, p[:-1]),
            ("long-proof", leaves[i], i, size, [*p, p[-1]]),
            ("reversed-proof", leaves[i], i, size, list(reversed(p))),
        ]
    mth = merkle_root(leaves)
    for label, leaf, index, sz, proof in cases:
        got = on_chain(leaf, index, sz, proof)
        # The audit path does not bind the tree size: a larger size whose path has the same
        # shape implies the same root (RFC 6962; Python agrees). Everything else must fail.
        assert got is verify_inclusion(leaf, index, sz, proof, mth), label
        if label not in ("wrong-size", "smaller-size"):
            assert not got, label
    # The spec leaf and the final record are in the tree, but they are not round records.
    assert verify_inclusion(leaves[0], 0, size, proofs[0], mth)
    assert not on_chain(leaves[0], 0, size, proofs[0])
    assert verify_inclusion(leaves[-1], size - 1, size, proofs[-1], mth)
    assert not on_chain(leaves[-1], size - 1, size, proofs[-1])
    assert not on_chain(leaves[1], 1, size, proofs[1], rr=h("other root"))
    # A MTH passed where the run root belongs: the prefix is recomputed on chain, so it fails.
    assert not on_chain(leaves[1], 1, size, proofs[1], rr=merkle_root(leaves))


def test_accepted_helper_matches_transcript(verifier: Any) -> None:
    receipt = RECEIPTS["trimmed-3-slashed"]()
    for rec in receipt.transcript:
        leaf = encode_round_record(rec)
        members = {a for o in rec.fragments for a in o.accepted}
        for a in [*TRAINERS, b"\xee" * 20]:
            count = sum(a in o.accepted for o in rec.fragments)
            checksum = Web3.to_checksum_address(a)
            assert verifier.functions.accepted(leaf, checksum).call({"gas": GAS}) is (a in members)
            assert verifier.functions.acceptedCountOrRevert(leaf, checksum).call({"gas": GAS}) == count
    assert verifier.functions.accepted(b"\x00" * 40, Web3.to_checksum_address(TRAINERS[0])).call({"gas": GAS}) is False


# --- gas ----------------------------------------------------------------------------------------


def rule_forgeries(receipt: TrainingReceipt) -> Iterator[tuple[str, TrainingReceipt]]:
    """Self-consistent receipts whose transcript breaks the spec's aggregation or quorum rule."""
    spec = receipt.spec
    doc = spec.to_dict()

    def with_spec(**changes: Any) -> TrainingTaskSpec:
        return TrainingTaskSpec.from_dict({**doc, **changes}, supported_only=False)

    def below_quorum(rec: RoundRecord) -> RoundRecord:  # fragment 0 keeps K - 1 inputs
        kept = rec.fragments[0].accepted[: spec.quorum - 1]
        trimmed = rec.rule.trimmed_per_side(len(kept))
        return dataclasses.replace(rec, fragments=(dataclasses.replace(rec.fragments[0], accepted=kept, trimmed=trimmed),
                                                   *rec.fragments[1:]))

    if spec.quorum >= 2:
        yield "below-quorum", rewritten_receipt(receipt, edit=below_quorum)
    most = max(len(o.accepted) for rec in receipt.transcript for o in rec.fragments)
    if most > spec.quorum:  # M lowered to K, under the largest accepted set
        yield "above-trainer-count", rewritten_receipt(receipt, spec=with_spec(trainer_count=spec.quorum))
    other = "CoordinateMedian" if spec.aggregation.to_spec() == "Mean" else "Mean"
    yield "spec-rule-other", rewritten_receipt(receipt, spec=with_spec(aggregation=other))
    # A fragment that does not exist, its accepted trainers paid for it.
    yield "extra-fragment", rewritten_receipt(receipt, edit=lambda rec: dataclasses.replace(
        rec, fragments=rec.fragments + rec.fragments[:1]))
    architecture = {**doc["architecture"], "fragment_count": spec.architecture.fragment_count + 1}
    yield "spec-fragment-count+1", rewritten_receipt(receipt, spec=with_spec(architecture=architecture))


@pytest.mark.parametrize("name", ["mean-2", "trimmed-3-slashed", "node-run-slashed", "median-8", "shadow-keys"])
def test_transcripts_breaking_the_rule_or_quorum_are_refused_by_both(verifier: Any, name: str) -> None:
    """A node committing a round below quorum (honest inputs dropped from the aggregate and the
    payouts) or with another rule than the spec's, root and weights recomputed: every other rule
    holds, and both verifiers refuse it."""
    receipt = RECEIPTS[name]()
    labels = []
    for label, forged in rule_forgeries(receipt):
        labels.append(label)
        data = encode_receipt(forged)
        assert verify_receipt_root(forged), label
        assert not py_verify(forged.run_root, data), label
        assert not sol_verify(verifier, forged.run_root, data), label
    assert {"below-quorum", "spec-rule-other", "extra-fragment", "spec-fragment-count+1"} <= set(labels)


@pytest.mark.parametrize("rounds", [2, 8])
def test_gas_of_verify(verifier: Any, rounds: int) -> None:
    receipt = build_receipt(rounds)
    data = encode_receipt(receipt)
    ok, used = verifier.functions.gasOfVerify(receipt.run_root, data).call({"gas": GAS})
    w3 = verifier.w3
    tx = verifier.functions.verifyOrRevert(receipt.run_root, data).transact({"from": w3.eth.accounts[0], "gas": GAS})
    mined = w3.eth.wait_for_transaction_receipt(tx)
    assert mined.status == 1
    tx_gas = mined.gasUsed
    assert ok is True and 0 < used < tx_gas
    print(f"\nverify() with {rounds} rounds, {len(data)} receipt bytes: {used} gas in the library, "
          f"{tx_gas} gas as a transaction (calldata + call overhead included)")


def test_dataclass_replace_receipts_still_roundtrip() -> None:
    # Guard for the builder itself: a TrainingReceipt edited field by field re-encodes.
    receipt = build_receipt(2)
    changed = dataclasses.replace(receipt, sealed_at=receipt.sealed_at + 1)
    assert encode_receipt(changed) != encode_receipt(receipt)


def test_documented_limit_spec_grammar_is_not_rechecked_under_a_forged_root(verifier: Any) -> None:
    """docs/solidity-verifier.md "The spec": with a root recomputed by the forger over a
    non-canonical spec (trailing bytes), Python refuses and Solidity accepts. Under the trusted
    root both refuse. This pins the one known disagreement class so a change is noticed."""
    receipt = RECEIPTS["mean-2"]()
    v = list(_abi_value(receipt))
    v[2] = v[2] + b" "
    forged_root = reroot(v)
    data = encode_value(v)
    assert not py_verify(forged_root, data)
    assert sol_verify(verifier, forged_root, data)
    assert not py_verify(receipt.run_root, data)
    assert not sol_verify(verifier, receipt.run_root, data)
