"""TrainingReceipt: derivation from a sealed run, JSON round trip, root verification, tampering."""

from __future__ import annotations

import dataclasses
import json

import pytest

from tenzro_training.errors import EncodingError, InvalidState
from tenzro_training.merkle import inclusion_proof, verify_inclusion
from tenzro_training.records import FragmentOutcome, compute_run_leaves, encode_round_record
from tenzro_training.receipt import (
    ReceiptTrainer,
    TrainingReceipt,
    compute_receipt,
    verify_receipt,
    verify_receipt_root,
)
from tests.test_run import GRACE_MS, TRAINERS, Env, h, make_spec, play_to_sealed, ranked


def sealed_env(with_failover: bool = False) -> Env:
    env = Env()
    env.to_training()
    return play_to_sealed(env, with_failover=with_failover)


@pytest.fixture(scope="module")
def receipt() -> TrainingReceipt:
    return compute_receipt(sealed_env().run)


def test_receipt_fields_come_from_the_sealed_run(receipt: TrainingReceipt) -> None:
    run = sealed_env().run
    assert receipt.task_id == run.task_id and receipt.spec == run.spec
    assert receipt.run_root == run.run_root
    assert receipt.final_model_hash == run.model_hash == run.records[-1].model_hash
    assert receipt.transcript == run.records
    assert [t.address for t in receipt.trainers] == TRAINERS[:3]  # enrollment order
    assert [t.accepted_submissions for t in receipt.trainers] == [4, 2, 4]
    assert [t.reward_weight for t in receipt.trainers] == [4, 2, 4]
    assert receipt.syncers == (ranked_syncer(run),)
    assert receipt.sealed_at == run.ended_at_ms // 1000


def ranked_syncer(run):  # type: ignore[no-untyped-def]
    return run.election.ranking[0].address


def test_receipt_root_verifies(receipt: TrainingReceipt) -> None:
    assert verify_receipt_root(receipt)
    assert verify_receipt(receipt)


def test_receipt_json_round_trip(receipt: TrainingReceipt) -> None:
    text = json.dumps(receipt.to_dict(), sort_keys=True)
    back = TrainingReceipt.from_dict(json.loads(text))
    assert back == receipt
    assert verify_receipt(back)
    assert json.dumps(back.to_dict(), sort_keys=True) == text


def test_round_record_inclusion_proof_against_receipt_root(receipt: TrainingReceipt) -> None:
    leaves = compute_run_leaves(receipt.spec.canonical_bytes(), receipt.transcript, receipt.final_record)
    proof = inclusion_proof(leaves, 2)
    # The run root is a domain-separated hash of MTH; the audit path proves against MTH.
    from tenzro_training.merkle import merkle_root

    assert verify_inclusion(encode_round_record(receipt.transcript[1]), 2, len(leaves), proof, merkle_root(leaves))


def test_receipt_records_every_syncer_after_failover() -> None:
    env = sealed_env(with_failover=True)
    receipt = compute_receipt(env.run)
    first, second = ranked(env)
    assert receipt.syncers == (first, second)
    assert [r.syncer_rank for r in receipt.transcript] == [1, 2]
    assert verify_receipt(receipt)


def test_slashed_trainer_has_zero_reward_weight() -> None:
    trainer = ReceiptTrainer("did:tenzro:node:x", TRAINERS[0], 5, 3, True)
    assert trainer.reward_weight == 0 and trainer.accepted_submissions == 3


# --- tamper detection -----------------------------------------------------------------------


def _replace_record(receipt: TrainingReceipt, index: int, **changes: object) -> TrainingReceipt:
    transcript = list(receipt.transcript)
    transcript[index] = dataclasses.replace(transcript[index], **changes)
    return dataclasses.replace(receipt, transcript=tuple(transcript))


@pytest.mark.parametrize(
    "tamper",
    [
        lambda r: dataclasses.replace(r, run_root=h("forged root")),
        lambda r: dataclasses.replace(r, final_model_hash=h("other model")),
        lambda r: dataclasses.replace(r, spec=make_spec(created_at=1)),
        lambda r: dataclasses.replace(r, spec=make_spec(reward_pool="999999")),
        lambda r: _replace_record(r, 0, model_hash=h("other")),
        lambda r: _replace_record(r, 1, syncer=TRAINERS[3]),
        lambda r: _replace_record(r, 0, syncer_rank=2),
        lambda r: dataclasses.replace(r, transcript=r.transcript[:1]),
        lambda r: dataclasses.replace(r, transcript=r.transcript[::-1]),
        lambda r: _replace_record(
            r,
            1,
            fragments=(
                FragmentOutcome(h("x"), r.transcript[1].fragments[0].accepted, 0, 0, h("y")),
                r.transcript[1].fragments[1],
            ),
        ),
        lambda r: _replace_record(
            r,
            0,
            fragments=(
                FragmentOutcome(
                    r.transcript[0].fragments[0].aggregate_hash,
                    r.transcript[0].fragments[0].accepted[:2],
                    0,
                    0,
                    r.transcript[0].fragments[0].report_hash,
                ),
                r.transcript[0].fragments[1],
            ),
        ),
    ],
)
def test_invalid_tampered_receipt_fails_root_verification(receipt: TrainingReceipt, tamper) -> None:  # type: ignore[no-untyped-def]
    forged = tamper(receipt)
    assert not verify_receipt_root(forged)
    assert not verify_receipt(forged)


@pytest.mark.parametrize(
    "tamper",
    [
        lambda r: dataclasses.replace(
            r, trainers=(dataclasses.replace(r.trainers[0], accepted_submissions=9),) + r.trainers[1:]
        ),
        lambda r: dataclasses.replace(r, trainers=r.trainers[1:]),
        lambda r: dataclasses.replace(r, trainers=r.trainers + (r.trainers[0],)),
        lambda r: dataclasses.replace(r, syncers=r.syncers + (TRAINERS[3],)),
        lambda r: dataclasses.replace(r, syncers=()),
    ],
)
def test_invalid_fields_derived_from_transcript_are_checked(receipt: TrainingReceipt, tamper) -> None:  # type: ignore[no-untyped-def]
    forged = tamper(receipt)
    assert verify_receipt_root(forged)  # the root does not commit these fields ...
    assert not verify_receipt(forged)  # ... but the transcript determines them


def test_invalid_receipt_verdicts_are_the_bool_false(receipt: TrainingReceipt) -> None:
    """Both verifiers return a bool (the CLI and receipt_abi pass it on), never a falsy None."""
    short = dataclasses.replace(receipt, transcript=receipt.transcript[:1])  # fewer rounds than max_rounds
    reordered = _replace_record(receipt, 0, round=1)  # two records of round 1: compute_run_leaves raises
    assert verify_receipt_root(short) is False and verify_receipt(short) is False
    assert verify_receipt_root(reordered) is False and verify_receipt(reordered) is False
    miscounted = dataclasses.replace(
        receipt, trainers=(dataclasses.replace(receipt.trainers[0], accepted_submissions=9),) + receipt.trainers[1:]
    )
    assert verify_receipt_root(miscounted) is True and verify_receipt(miscounted) is False
    assert verify_receipt_root(receipt) is True and verify_receipt(receipt) is True


def test_receipt_of_a_trainer_with_no_accepted_submission_verifies() -> None:
    env = Env()
    env.to_training()
    now = 300
    for _ in range(2):  # trainer 1 is enrolled but never submits
        for f in (0, 1):
            env.submit(0, f, now)
            env.submit(2, f, now + 10)
        now += 10 + GRACE_MS + 1
        env.finalize(now)
        now += 100
    receipt = compute_receipt(env.run)
    assert [t.accepted_submissions for t in receipt.trainers] == [4, 0, 4]
    assert verify_receipt(receipt) is True
    assert verify_receipt(TrainingReceipt.from_dict(json.loads(json.dumps(receipt.to_dict())))) is True


def test_invalid_receipt_of_unsealed_run() -> None:
    env = Env()
    env.to_training()
    with pytest.raises(InvalidState):
        compute_receipt(env.run)


@pytest.mark.parametrize(
    "field, value",
    [
        ("run_root", b"\0" * 31),
        ("run_root", b"\0" * 33),
        ("run_root", bytearray(32)),
        ("final_model_hash", b"\0" * 20),
        ("final_model_hash", "0x" + "00" * 32),
        ("syncers", (b"\0" * 19,)),
        ("syncers", (bytearray(20),)),
    ],
    ids=["root-31", "root-33", "root-bytearray", "model-hash-20", "model-hash-hex", "syncer-19", "syncer-bytearray"],
)
def test_invalid_receipt_byte_fields_of_the_wrong_length_or_type(receipt: TrainingReceipt, field: str,
                                                                 value: object) -> None:
    with pytest.raises(EncodingError, match=field):
        dataclasses.replace(receipt, **{field: value})


@pytest.mark.parametrize("address", [b"\0" * 19, b"\0" * 21, bytearray(20), "0x" + "00" * 20],
                         ids=["19-bytes", "21-bytes", "bytearray", "hex-text"])
def test_invalid_receipt_trainer_address(address: object) -> None:
    ReceiptTrainer("did:tenzro:node:t0", b"\0" * 20, 1, 0, False)
    with pytest.raises(EncodingError, match="trainer.address"):
        ReceiptTrainer("did:tenzro:node:t0", address, 1, 0, False)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "field, make",
    [
        ("transcript", lambda r: (r.transcript[0], "round 1")),
        ("transcript", lambda r: (r.transcript[0], r.transcript[1].fragments[0])),
        ("trainers", lambda r: r.trainers + (r.trainers[0].to_dict(),)),
        ("trainers", lambda r: ("did:tenzro:node:t0",)),
        ("syncers", lambda r: ("0x" + "11" * 20,)),
    ],
    ids=["transcript-str", "transcript-outcome", "trainers-dict", "trainers-str", "syncers-hex"],
)
def test_invalid_receipt_tuples_holding_another_type(receipt: TrainingReceipt, field: str, make) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(EncodingError, match=f"{field}: expected a tuple of"):
        dataclasses.replace(receipt, **{field: make(receipt)})


def test_invalid_receipt_of_something_that_is_not_a_run_state() -> None:
    run = sealed_env().run
    for not_a_run in (None, "run", run.to_dict()):
        with pytest.raises(EncodingError, match="needs a RunState"):
            compute_receipt(not_a_run)  # type: ignore[arg-type]


def test_verify_never_raises_on_garbage() -> None:
    assert verify_receipt_root("not a receipt") is False  # type: ignore[arg-type]
    assert verify_receipt(None) is False  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "mutate",
    [
        lambda d: d.update(version=2),
        lambda d: d.update(version=True),  # true == 1 in Python: refused as not an integer
        lambda d: d.update(version=1.0),
        lambda d: d.update(run_root="0x" + "AB" * 32),
        lambda d: d.update(run_root="0x1234"),
        lambda d: d.update(task_id="other-task"),
        lambda d: d.pop("syncers"),
        lambda d: d.update(extra=True),
        lambda d: d["trainers"][0].update(stake=50),
        lambda d: d["trainers"][0].update(stake="050"),
        lambda d: d["trainers"][0].update(stake="1" * 79),  # over uint256's 78 digits
        lambda d: d["trainers"][0].update(stake="1" * 4301),  # int() refused it with a bare ValueError
        lambda d: d["trainers"][0].update(did="did:web:x"),
        lambda d: d["transcript"][0].update(round=-1),
        lambda d: d["syncers"].append("0x1234"),
        lambda d: d.update(sealed_at=-1),
        lambda d: d["spec"].update(quorum=9),
    ],
)
def test_invalid_receipt_dicts_are_rejected(receipt: TrainingReceipt, mutate) -> None:  # type: ignore[no-untyped-def]
    d = json.loads(json.dumps(receipt.to_dict()))
    mutate(d)
    with pytest.raises(EncodingError):
        TrainingReceipt.from_dict(d)
