"""receipt_check: a real sealed run passes every check; each tampering fails the check named for it.

The documents are real getReceipt results of in-process node runs (tests/chain/conftest.py
``run_to_sealed``), round-tripped through JSON as the CLI reads them; tampering edits that JSON.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tenzro_training import auth
from tenzro_training.errors import EncodingError
from tenzro_training.receipt import TrainingReceipt
from tenzro_training.receipt_check import (
    CHECK_NAMES,
    Attestations,
    ReceiptCheck,
    check_receipt,
    check_receipt_document,
)
from tests.chain.conftest import rewritten_receipt, run_to_sealed, trainer_party
from tests.node.conftest import SYNCERS, TRAINERS

Doc = dict[str, Any]


def _document(tmp: Path, **kwargs: Any) -> Doc:
    run = run_to_sealed(tmp, **kwargs)
    return json.loads(json.dumps(run.service.get_receipt(run.task_id)))


@pytest.fixture(scope="module")
def good(tmp_path_factory: pytest.TempPathFactory) -> Doc:
    """Three trainers, trainer 2 skips round 1 (unequal weights), two rounds."""
    return _document(tmp_path_factory.mktemp("good"), skip=lambda i, r: i == 2 and r == 1)


@pytest.fixture(scope="module")
def slashed(tmp_path_factory: pytest.TempPathFactory) -> Doc:
    """Trainer 1 equivocates in round 0 and is slashed."""
    return _document(tmp_path_factory.mktemp("slashed"), task_id="run-slashed", equivocate=1)


@pytest.fixture(scope="module")
def slashed_late(tmp_path_factory: pytest.TempPathFactory) -> Doc:
    """Trainer 1 is accepted in round 0, then in round 1 signs another payload for round 0
    (finalized): slashed in round 1, out of rounds 1 and 2."""
    return _document(tmp_path_factory.mktemp("slashed-late"), task_id="run-slashed-late", rounds=3,
                     equivocate=1, equivocate_round=1, equivocate_late=True)


def failed(doc: object, chain_id: int | None = None) -> tuple[str, ...]:
    return check_receipt_document(doc, chain_id).failed


def tampered(doc: Doc, edit: Any) -> Doc:
    out = copy.deepcopy(doc)
    edit(out)
    return out


def flip_hex(text: str, at: int = -3) -> str:
    """Change one hex digit (position ``at`` counted in the hex string)."""
    digits = list(text)
    digits[at] = "0" if digits[at] != "0" else "1"
    return "".join(digits)


def sign_hex(party: Any, msg: auth.SignedMessageType) -> str:
    return "0x" + party.sign(msg).hex()


# --- valid ---------------------------------------------------------------------------------------


def test_a_sealed_run_passes_every_check(good: Doc) -> None:
    result = check_receipt_document(good)
    assert result.ok, result.checks
    assert tuple(c.name for c in result.checks) == CHECK_NAMES
    assert all(c.detail for c in result.checks)
    # Every accepted submission of the transcript was checked: 3 trainers x 2 fragments in
    # round 0, 2 trainers x 2 fragments in round 1.
    sub = result.get("submission_signatures")
    assert sub is not None and sub.detail.startswith("10 ")


def test_a_run_with_a_slashed_trainer_passes(slashed: Doc) -> None:
    assert check_receipt_document(slashed).ok
    trainers = {t["address"]: t for t in slashed["receipt"]["trainers"]}
    slashed_trainer = trainer_party(1).text
    assert trainers[slashed_trainer]["slashed"] and trainers[slashed_trainer]["accepted_submissions"] == 0
    # Its first (accepted, then superseded by the equivocation) submission is still attested
    # and verifies, though it is in no accepted list.
    round0 = slashed["attestations"]["rounds"][0]["submissions"]
    assert any(s["trainer"] == slashed_trainer for s in round0)


# --- slashing evidence ---------------------------------------------------------------------------


def test_the_slashing_is_attested_with_both_signed_payload_hashes(slashed: Doc) -> None:
    slashings = slashed["attestations"]["slashings"]
    assert [(s["trainer"], s["round"]) for s in slashings] == [(trainer_party(1).text, 0)]
    first, second = slashings[0]["payloads"]
    assert first["payload_hash"] != second["payload_hash"]
    detail = check_receipt_document(slashed).get("slashings")
    assert detail is not None and detail.ok and detail.detail.startswith("1 slashed")
    assert Attestations.from_dict(slashed["attestations"]).to_dict() == slashed["attestations"]


def test_invalid_slashed_flag_without_evidence(good: Doc, slashed: Doc) -> None:
    """A node marking an honest trainer slashed (withholding its reward and stake) is caught."""
    def drop(d: Doc) -> None:
        d["attestations"]["slashings"] = []

    assert failed(tampered(slashed, drop)) == ("slashings",)

    def mark(d: Doc) -> None:  # the ABI changes with the flag; the run root does not commit it
        d["receipt"]["trainers"][0]["slashed"] = True

    assert failed(tampered(good, mark)) == ("abi", "slashings")


def test_invalid_evidence_against_an_unslashed_trainer(good: Doc, slashed: Doc) -> None:
    def edit(d: Doc) -> None:
        d["attestations"]["slashings"] = copy.deepcopy(slashed["attestations"]["slashings"])

    assert failed(tampered(good, edit)) == ("slashings",)


def test_invalid_evidence_signatures_and_hashes(slashed: Doc) -> None:
    def flip_signature(d: Doc) -> None:
        entry = d["attestations"]["slashings"][0]["payloads"][1]
        entry["signature"] = flip_hex(entry["signature"], 10)

    def same_hash(d: Doc) -> None:
        first, second = d["attestations"]["slashings"][0]["payloads"]
        second.update(first)

    def other_fragment(d: Doc) -> None:  # the signatures no longer cover what is claimed
        entry = d["attestations"]["slashings"][0]
        entry["fragment"] = 1 - entry["fragment"]

    def lost_first_signature(d: Doc) -> None:
        d["attestations"]["slashings"][0]["payloads"][0]["signature"] = None

    def signed_by_another(d: Doc) -> None:
        entry = d["attestations"]["slashings"][0]
        for p in entry["payloads"]:
            msg = auth.SubmitOuterGradient(task_id=d["receipt"]["task_id"], round=entry["round"],
                                           fragment=entry["fragment"], payload_hash=bytes.fromhex(p["payload_hash"][2:]))
            p["signature"] = sign_hex(trainer_party(0), msg)

    for edit in (flip_signature, same_hash, other_fragment, lost_first_signature, signed_by_another):
        assert failed(tampered(slashed, edit)) == ("slashings",), edit.__name__


def test_invalid_slashed_trainer_accepted_after_its_slashing(slashed: Doc) -> None:
    from tenzro_training.receipt_check import SlashingAttestation

    att = Attestations.from_dict(slashed["attestations"])
    receipt = TrainingReceipt.from_dict(slashed["receipt"])
    # Claim round 0's evidence for an honest trainer who was accepted in round 1: re-sign it.
    honest = trainer_party(0)
    hashes = (b"\x01" * 32, b"\x02" * 32)
    signatures = tuple(honest.sign(auth.SubmitOuterGradient(task_id=receipt.task_id, round=0, fragment=0,
                                                            payload_hash=h)) for h in hashes)
    forged = SlashingAttestation(honest.address, 0, 0, hashes, (signatures[0], signatures[1]), 0)
    receipt = receipt.__class__.from_dict({**receipt.to_dict(), "trainers": [
        {**t, "slashed": True} if t["address"] == honest.text else t for t in receipt.to_dict()["trainers"]]})
    result = check_receipt(receipt, att.__class__(att.chain_id, att.election, att.rounds, att.slashings + (forged,)),
                           auth.DEFAULT_CHAIN_ID)
    check = result.get("slashings")
    assert check is not None and not check.ok and "accepted" in check.detail


def test_a_slashing_for_a_finalized_round_takes_effect_in_the_current_round(slashed_late: Doc) -> None:
    assert check_receipt_document(slashed_late).ok
    (slashing,) = slashed_late["attestations"]["slashings"]
    culprit = trainer_party(1).text
    assert (slashing["trainer"], slashing["round"], slashing["slashed_in_round"]) == (culprit, 0, 1)
    receipt = slashed_late["receipt"]
    accepted = [[f["accepted"] for f in record["fragments"]] for record in receipt["transcript"]]
    assert all(culprit in lists for lists in accepted[0])  # round 0 keeps its inputs
    assert not any(culprit in lists for record in accepted[1:] for lists in record)
    trainer = next(t for t in receipt["trainers"] if t["address"] == culprit)
    # Its two round-0 inputs count in the transcript; slashed, it is paid nothing (ABI weight 0).
    assert trainer["slashed"] and trainer["accepted_submissions"] == 2

    def earlier(d: Doc) -> None:  # claimed in effect from round 0, which accepted it
        d["attestations"]["slashings"][0]["slashed_in_round"] = 0

    def before_the_evidence(d: Doc) -> None:
        d["attestations"]["slashings"][0]["round"] = 1  # also breaks the signatures
        d["attestations"]["slashings"][0]["slashed_in_round"] = 0

    def after_the_run(d: Doc) -> None:
        d["attestations"]["slashings"][0]["slashed_in_round"] = 3

    def as_version_2(d: Doc) -> None:  # version 2 means "in effect from the evidence round"
        d["attestations"]["version"] = 2
        d["attestations"]["slashings"][0].pop("slashed_in_round")

    for edit in (earlier, before_the_evidence, after_the_run, as_version_2):
        assert failed(tampered(slashed_late, edit)) == ("slashings",), edit.__name__


def test_version_2_attestations_are_read_as_slashed_in_the_evidence_round(slashed: Doc) -> None:
    def to_v2(d: Doc) -> None:
        d["attestations"]["version"] = 2
        for s in d["attestations"]["slashings"]:
            assert s.pop("slashed_in_round") == s["round"]

    assert check_receipt_document(tampered(slashed, to_v2)).ok

    def v2_with_the_new_key(d: Doc) -> None:
        d["attestations"]["version"] = 2

    with pytest.raises(EncodingError, match="exactly the fields"):
        Attestations.from_dict(tampered(slashed, v2_with_the_new_key)["attestations"])


def test_version_1_attestations_are_read_as_attesting_no_slashing(good: Doc, slashed: Doc) -> None:
    def to_v1(d: Doc) -> None:
        d["attestations"]["version"] = 1
        d["attestations"].pop("slashings")

    assert check_receipt_document(tampered(good, to_v1)).ok
    assert failed(tampered(slashed, to_v1)) == ("slashings",)


def test_attestations_round_trip(good: Doc) -> None:
    att = Attestations.from_dict(good["attestations"])
    assert att.to_dict() == good["attestations"]
    assert att.chain_id == auth.DEFAULT_CHAIN_ID
    assert [r.round for r in att.rounds] == [0, 1]
    assert len(att.election.tickets) == len(SYNCERS) == len(att.election.ranking)


def test_check_receipt_on_values(good: Doc) -> None:
    receipt = TrainingReceipt.from_dict(good["receipt"])
    att = Attestations.from_dict(good["attestations"])
    result = check_receipt(receipt, att, auth.DEFAULT_CHAIN_ID)
    assert result.ok and result.get("abi") is None  # no ABI bytes given: that check does not run
    assert len(result.checks) == len(CHECK_NAMES) - 1


def test_an_explicit_matching_chain_id_passes(good: Doc) -> None:
    assert check_receipt_document(good, auth.DEFAULT_CHAIN_ID).ok


def test_task_id_check_comes_first_when_the_caller_names_the_run(good: Doc) -> None:
    task_id = good["receipt"]["spec"]["task_id"]
    result = check_receipt_document(good, task_id=task_id)
    assert result.ok
    assert tuple(c.name for c in result.checks) == ("task_id", *CHECK_NAMES)
    other = check_receipt_document(good, task_id="another-run")
    assert other.failed == ("task_id",)  # every other check still passes: the receipt is valid
    assert repr(task_id) in other.checks[0].detail


@pytest.mark.parametrize("chain_id", ["1337", True, 1337.0, None])
def test_invalid_chain_id_type_is_one_failed_check(good: Doc, chain_id: object) -> None:
    receipt = TrainingReceipt.from_dict(good["receipt"])
    att = Attestations.from_dict(good["attestations"])
    result = check_receipt(receipt, att, chain_id)  # type: ignore[arg-type]
    assert [(c.name, c.ok) for c in result.checks] == [("chain_id", False)]


def test_invalid_ticket_list_raising_in_a_check_is_a_failed_check(good: Doc) -> None:
    # The same candidate's ticket twice: each ticket verifies, but rank_candidates raises
    # ElectionError (duplicate candidate). A check that raises is a failed check, never an exception.
    doc = tampered(good, lambda d: d["attestations"]["election"]["tickets"].append(
        copy.deepcopy(d["attestations"]["election"]["tickets"][0])))
    result = check_receipt_document(doc)
    assert result.failed == ("ranking", "round_syncers")
    ranking = result.get("ranking")
    assert ranking is not None and ranking.detail.startswith("ElectionError: ")


# --- the election ---------------------------------------------------------------------------------


def test_invalid_ticket_proof(good: Doc) -> None:
    def edit(d: Doc) -> None:
        ticket = d["attestations"]["election"]["tickets"][0]
        ticket["proof"] = flip_hex(ticket["proof"], 10)

    names = failed(tampered(good, edit))
    assert "tickets" in names and "ranking" in names  # the recomputed ranking loses that candidate
    assert "election_seed" not in names and "finalize_signatures" not in names


def test_invalid_ticket_stake(good: Doc) -> None:
    def edit(d: Doc) -> None:
        d["attestations"]["election"]["tickets"][0]["stake"] = "999"

    # The proof still verifies; the ranking recomputed with that stake differs from the stored one.
    names = failed(tampered(good, edit))
    assert "ranking" in names and "tickets" not in names


def test_invalid_ranking_order(good: Doc) -> None:
    def edit(d: Doc) -> None:
        ranking = d["attestations"]["election"]["ranking"]
        ranking[0], ranking[1] = ranking[1], ranking[0]
        ranking[0]["rank"], ranking[1]["rank"] = 1, 2

    # Round syncers are checked against the RECOMPUTED ranking, so only "ranking" fails.
    assert failed(tampered(good, edit)) == ("ranking",)


def test_invalid_ranking_entry_score(good: Doc) -> None:
    def edit(d: Doc) -> None:
        d["attestations"]["election"]["ranking"][2]["score"] = "1"

    assert failed(tampered(good, edit)) == ("ranking",)


def test_invalid_ranking_truncated(good: Doc) -> None:
    assert failed(tampered(good, lambda d: d["attestations"]["election"]["ranking"].pop())) == ("ranking",)


def test_invalid_election_seed(good: Doc) -> None:
    def edit(d: Doc) -> None:
        election = d["attestations"]["election"]
        election["seed"] = flip_hex(election["seed"])

    # Tickets and ranking are checked over the seed the spec determines, not the stored one.
    assert failed(tampered(good, edit)) == ("election_seed",)


# --- signatures -----------------------------------------------------------------------------------


def test_invalid_finalize_signature_tampered(good: Doc) -> None:
    def edit(d: Doc) -> None:
        r = d["attestations"]["rounds"][1]
        r["finalize_signature"] = flip_hex(r["finalize_signature"], 20)

    assert failed(tampered(good, edit)) == ("finalize_signatures",)


def test_invalid_finalize_signature_by_another_syncer(good: Doc) -> None:
    syncer = good["receipt"]["transcript"][0]["syncer"]
    other = next(s for s in SYNCERS if s.text != syncer)
    task_id = good["receipt"]["task_id"]

    def edit(d: Doc) -> None:
        d["attestations"]["rounds"][0]["finalize_signature"] = sign_hex(other, auth.FinalizeRound(task_id=task_id, round=0))

    result = check_receipt_document(tampered(good, edit))
    assert result.failed == ("finalize_signatures",)
    detail = result.get("finalize_signatures")
    assert detail is not None and other.text in detail.detail


def test_invalid_finalize_signature_for_another_round(good: Doc) -> None:
    def edit(d: Doc) -> None:
        rounds = d["attestations"]["rounds"]
        rounds[0]["finalize_signature"] = rounds[1]["finalize_signature"]

    assert failed(tampered(good, edit)) == ("finalize_signatures",)


def test_invalid_finalize_signature_missing(good: Doc) -> None:
    def edit(d: Doc) -> None:
        d["attestations"]["rounds"][0]["finalize_signature"] = None

    assert failed(tampered(good, edit)) == ("finalize_signatures",)


def test_invalid_attested_rounds_missing(good: Doc) -> None:
    names = failed(tampered(good, lambda d: d["attestations"]["rounds"].pop()))
    assert names == ("finalize_signatures", "submission_signatures")


def test_invalid_submission_signature_tampered(good: Doc) -> None:
    def edit(d: Doc) -> None:
        sub = d["attestations"]["rounds"][0]["submissions"][0]
        sub["signature"] = flip_hex(sub["signature"], 30)

    assert failed(tampered(good, edit)) == ("submission_signatures",)


def test_invalid_submission_payload_hash(good: Doc) -> None:
    def edit(d: Doc) -> None:
        sub = d["attestations"]["rounds"][1]["submissions"][-1]
        sub["payload_hash"] = flip_hex(sub["payload_hash"])

    # The signature now recovers to some other address.
    assert failed(tampered(good, edit)) == ("submission_signatures",)


def test_invalid_submission_missing(good: Doc) -> None:
    assert failed(tampered(good, lambda d: d["attestations"]["rounds"][1]["submissions"].pop())) == (
        "submission_signatures",
    )


def test_invalid_submission_signed_by_another_trainer(good: Doc) -> None:
    task_id = good["receipt"]["task_id"]

    def edit(d: Doc) -> None:
        sub = d["attestations"]["rounds"][0]["submissions"][0]
        msg = auth.SubmitOuterGradient(
            task_id=task_id, round=0, fragment=sub["fragment"], payload_hash=bytes.fromhex(sub["payload_hash"][2:])
        )
        signer = next(p for p in (trainer_party(i) for i in range(3)) if p.text != sub["trainer"])
        sub["signature"] = sign_hex(signer, msg)

    assert failed(tampered(good, edit)) == ("submission_signatures",)


def test_invalid_chain_id(good: Doc) -> None:
    # Verifying for another chain: the chain-id check and every signature fail.
    names = failed(good, chain_id=1)
    assert names == ("chain_id", "finalize_signatures", "submission_signatures")


# --- the receipt itself ---------------------------------------------------------------------------


def test_invalid_round_record_aggregate_hash(good: Doc) -> None:
    def edit(d: Doc) -> None:
        fragment = d["receipt"]["transcript"][1]["fragments"][0]
        fragment["aggregate_hash"] = flip_hex(fragment["aggregate_hash"])

    names = failed(tampered(good, edit))
    assert "run_root" in names and "abi" in names
    assert "round_records" not in names and "finalize_signatures" not in names


def test_invalid_round_record_model_hash(good: Doc) -> None:
    def edit(d: Doc) -> None:
        last = d["receipt"]["transcript"][-1]
        last["model_hash"] = flip_hex(last["model_hash"])

    names = failed(tampered(good, edit))
    assert "round_records" in names and "run_root" in names


def test_invalid_round_record_rule_differs_from_spec(good: Doc) -> None:
    def edit(d: Doc) -> None:
        d["receipt"]["spec"]["aggregation"] = "CoordinateMedian"

    names = failed(tampered(good, edit))
    assert "round_records" in names and "run_root" in names and "election_seed" in names


def test_invalid_round_record_removed(good: Doc) -> None:
    names = failed(tampered(good, lambda d: d["receipt"]["transcript"].pop()))
    assert {"round_records", "run_root", "trainer_weights"} <= set(names)


def test_invalid_spec(good: Doc) -> None:
    def edit(d: Doc) -> None:
        d["receipt"]["spec"]["dataset_ref"] = "ipfs://another"

    # The spec is leaf 0 and its hash seeds the election.
    names = failed(tampered(good, edit))
    assert {"run_root", "election_seed", "tickets", "ranking", "abi"} <= set(names)
    assert "finalize_signatures" not in names and "submission_signatures" not in names


def test_invalid_trainer_weight(good: Doc) -> None:
    def edit(d: Doc) -> None:
        d["receipt"]["trainers"][0]["accepted_submissions"] += 1

    names = failed(tampered(good, edit))
    assert "trainer_weights" in names and "run_root" not in names


def test_invalid_syncer_list(good: Doc) -> None:
    def edit(d: Doc) -> None:
        d["receipt"]["syncers"].append(TRAINERS[0].text)

    assert "syncer_list" in failed(tampered(good, edit))


def test_invalid_run_root_claimed(good: Doc) -> None:
    def edit(d: Doc) -> None:
        d["run_root"] = flip_hex(d["run_root"])

    assert failed(tampered(good, edit)) == ("run_root",)


def test_invalid_abi_bytes(good: Doc) -> None:
    def edit(d: Doc) -> None:
        d["abi"] = flip_hex(d["abi"], 200)

    assert failed(tampered(good, edit)) == ("abi",)


# --- malformed documents never raise --------------------------------------------------------------


@pytest.mark.parametrize(
    "edit",
    [
        lambda d: d.pop("attestations"),
        lambda d: d.pop("receipt"),
        lambda d: d["attestations"].update(version=4),
        lambda d: d["attestations"].update(version=True),
        lambda d: d["attestations"].pop("slashings"),
        lambda d: d["attestations"]["slashings"].append({"trainer": TRAINERS[0].text}),
        lambda d: d["attestations"]["election"].pop("ranking"),
        lambda d: d["attestations"]["election"]["tickets"][0].update(proof="0x12"),
        lambda d: d["attestations"]["rounds"][0].update(round=-1),
        lambda d: d["attestations"]["rounds"][0].update(round=2**64),  # uint64: 2**64 - 1 at most
        lambda d: d["attestations"]["rounds"][0]["submissions"][0].update(fragment=True),
        lambda d: d["attestations"].update(chain_id=0),
        lambda d: d["receipt"].update(version=9),
        lambda d: d.update(abi="not hex"),
    ],
)
def test_invalid_document_is_a_failed_decode(good: Doc, edit: Any) -> None:
    result = check_receipt_document(tampered(good, edit))
    assert not result.ok and result.failed == ("decode",)


@pytest.mark.parametrize("doc", [None, 1, "x", [], {}, {"receipt": None, "attestations": None}])
def test_invalid_non_documents(doc: object) -> None:
    result = check_receipt_document(doc)
    assert isinstance(result, ReceiptCheck) and not result.ok


def test_invalid_values_to_check_receipt(good: Doc) -> None:
    att = Attestations.from_dict(good["attestations"])
    receipt = TrainingReceipt.from_dict(good["receipt"])
    assert not check_receipt("receipt", att, 1337).ok  # type: ignore[arg-type]
    assert not check_receipt(receipt, att, "1337").ok  # type: ignore[arg-type]


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=10,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(path=st.lists(st.integers(min_value=0, max_value=30), min_size=1, max_size=6), value=json_values)
def test_invalid_random_replacement_never_raises(good: Doc, path: list[int], value: object) -> None:
    """Replace one node of the document (walked by ``path``) with a random JSON value."""
    doc = copy.deepcopy(good)
    parent: Any = doc
    key: Any = None
    for step in path:
        container = parent if key is None else parent[key]
        if isinstance(container, dict) and container:
            next_key = sorted(container)[step % len(container)]
        elif isinstance(container, list) and container:
            next_key = step % len(container)
        else:
            break
        parent, key = container, next_key
    if key is None:
        return
    original = parent[key]
    parent[key] = value
    result = check_receipt_document(doc)  # must not raise
    optional = parent is doc and key in ("abi", "run_root") and value is None  # those checks are skipped
    if value != original and not optional:
        assert not result.ok


def _rewritten(doc: Doc, edit_record: Any) -> TrainingReceipt:
    """The document's receipt with every round record edited and everything derived from the
    transcript recomputed, as a node forging it would."""
    return rewritten_receipt(TrainingReceipt.from_dict(doc["receipt"]), edit=edit_record)


def test_invalid_transcript_below_quorum_with_inputs_dropped(good: Doc) -> None:
    """A node keeps one trainer as every fragment's only input (K = 2) and recomputes the root
    and weights: the record is below quorum, and the dropped trainers' signed submissions are
    attested but not accepted."""
    import dataclasses

    keep = TrainingReceipt.from_dict(good["receipt"]).transcript[0].fragments[0].accepted[0]
    forged = _rewritten(good, lambda rec: dataclasses.replace(rec, fragments=tuple(
        dataclasses.replace(o, accepted=(keep,)) for o in rec.fragments)))
    result = check_receipt(forged, Attestations.from_dict(good["attestations"]), auth.DEFAULT_CHAIN_ID)
    records, subs = result.get("round_records"), result.get("submission_signatures")
    assert records is not None and not records.ok and "1 accepted, quorum is 2 of 3" in records.detail
    assert subs is not None and not subs.ok and "is not among the accepted" in subs.detail
    assert result.get("run_root").ok and result.get("trainer_weights").ok  # type: ignore[union-attr]


def test_invalid_slashing_postdated_to_keep_an_equivocator_as_an_input(tmp_path: Path) -> None:
    """Trainer 1 equivocated within round 0 (dropped there) of a 3-round run. A node adds it,
    with a signed submission, to round 1 and claims the slashing took effect only in round 2:
    refused, since a late slashing needs round 0 to have accepted the first payload from it."""
    import dataclasses

    from tenzro_training.receipt_check import SubmissionAttestation

    culprit = trainer_party(1)
    poison = b"\x5a" * 32

    def add(rec: Any) -> Any:
        if rec.round != 1:
            return rec
        f0 = rec.fragments[0]
        return dataclasses.replace(rec, fragments=(
            dataclasses.replace(f0, accepted=tuple(sorted(f0.accepted + (culprit.address,)))), *rec.fragments[1:]))

    slashed = _document(tmp_path, task_id="run-slashed-3", rounds=3, equivocate=1)
    forged = _rewritten(slashed, add)
    att = Attestations.from_dict(slashed["attestations"])
    signature = culprit.sign(auth.SubmitOuterGradient(task_id=forged.task_id, round=1, fragment=0, payload_hash=poison))
    round1 = att.rounds[1]
    subs = tuple(sorted(round1.submissions + (SubmissionAttestation(culprit.address, 0, poison, signature),),
                        key=lambda x: (x.fragment, x.trainer)))
    rounds = (att.rounds[0], dataclasses.replace(round1, submissions=subs), *att.rounds[2:])
    postdated = tuple(dataclasses.replace(x, slashed_in_round=2) for x in att.slashings)
    result = check_receipt(forged, dataclasses.replace(att, rounds=rounds, slashings=postdated), auth.DEFAULT_CHAIN_ID)
    # Also: its round-0 submission, dropped at the real slashing, is no longer excused.
    assert result.failed == ("submission_signatures", "slashings")
    assert "did not accept" in result.get("slashings").detail  # type: ignore[union-attr]
    # With the true slashing round, the forged round 1 is refused as accepting a slashed trainer.
    honest = check_receipt(forged, dataclasses.replace(att, rounds=rounds), auth.DEFAULT_CHAIN_ID)
    assert honest.failed == ("slashings",) and "accepted" in honest.get("slashings").detail  # type: ignore[union-attr]


def test_invalid_input_dropped_before_the_slashing_round(slashed_late: Doc) -> None:
    """Slashed in round 1 (for round 0 evidence), the trainer was an honest input of round 0:
    a node dropping its round-0 fragment-1 input from the record and the payouts is caught."""
    import dataclasses

    culprit = trainer_party(1).address

    def drop(rec: Any) -> Any:
        if rec.round != 0:
            return rec
        f1 = rec.fragments[1]
        return dataclasses.replace(rec, fragments=(
            rec.fragments[0], dataclasses.replace(f1, accepted=tuple(a for a in f1.accepted if a != culprit))))

    forged = _rewritten(slashed_late, drop)
    result = check_receipt(forged, Attestations.from_dict(slashed_late["attestations"]), auth.DEFAULT_CHAIN_ID)
    assert result.failed == ("submission_signatures",)
    assert "is not among the accepted" in result.get("submission_signatures").detail  # type: ignore[union-attr]


def test_invalid_syncer_rank_going_back_up(good: Doc) -> None:
    import dataclasses

    att = Attestations.from_dict(good["attestations"])
    ranked = [r.address for r in att.election.ranking]
    ranks = iter((2, 1))

    def edit(rec: Any) -> Any:
        rank = next(ranks)
        return dataclasses.replace(rec, syncer_rank=rank, syncer=ranked[rank - 1])

    check = check_receipt(_rewritten(good, edit), att, auth.DEFAULT_CHAIN_ID).get("round_syncers")
    assert check is not None and not check.ok and "syncer_rank 1 after rank 2" in check.detail
