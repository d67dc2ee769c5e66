"""run_replay.py: a real sealed run (an in-process node over a MemoryStore) recomputed from its
receipt document and its inputs, each source a plain callable over the node's store; every
substitution a node could make fails the check named for it, and stops the checks that need it."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
import torch

from storage import schema
from tenzro_training.addresses import Address, format_address
from tenzro_training.errors import ArtifactUnavailable
from tenzro_training.node.checkpoint import parse_checkpoint_bytes
from tenzro_training.receipt import TrainingReceipt
from tenzro_training.receipt_abi import encode_receipt
from tenzro_training.receipt_check import CHECK_NAMES
from tenzro_training.records import FragmentOutcome, RoundRecord
from tenzro_training.run_replay import RUN_CHECK_NAMES, RunCheck, RunSources, verify_run
from tenzro_training.spec import TrainingTaskSpec
from tests.chain.conftest import SealedRun, rewritten_receipt, run_to_sealed


@dataclasses.dataclass
class Sealed:
    run: SealedRun
    document: dict[str, Any]
    view: dict[str, Any]
    checkpoint: bytes

    def payload_hash(self, round_: int, fragment: int, trainer: Address) -> bytes:
        for r in self.document["attestations"]["rounds"]:
            for s in r["submissions"]:
                if (r["round"], s["fragment"], s["trainer"].lower()) == (round_, fragment, "0x" + trainer.hex()):
                    return bytes.fromhex(s["payload_hash"][2:])
        raise KeyError((round_, fragment, trainer))

    def stored_payload(self, round_: int, fragment: int, trainer: Address) -> bytes:
        data = self.run.store.get(schema.CF_SUBMISSIONS, schema.payload_key(self.run.task_id,
                                                                           self.payload_hash(round_, fragment, trainer)))
        assert data is not None
        return data

    def sources(self, **changes: Any) -> RunSources:
        """Sources that answer what the node holds; ``changes`` swaps one for a faulty one."""
        sources = RunSources(
            run_view=lambda: self.view,
            checkpoint=lambda max_bytes: self.checkpoint,
            parse_checkpoint=lambda data: parse_checkpoint_bytes(data, "test"),
            payload=lambda r, f, t, max_bytes: self.stored_payload(r, f, t),
            model_file=lambda size: self.run.service.export_final_model(self.run.task_id),
        )
        return dataclasses.replace(sources, **changes)


@pytest.fixture(scope="module")
def sealed(tmp_path_factory: pytest.TempPathFactory) -> Sealed:
    run = run_to_sealed(tmp_path_factory.mktemp("run"))
    document = json.loads(json.dumps(run.service.get_receipt(run.task_id)))
    view = json.loads(json.dumps(run.service.get_run(run.task_id)))
    ref = TrainingTaskSpec.from_dict(view["spec"]).init_checkpoint()
    assert ref is not None
    return Sealed(run, document, view, Path(ref.uri.removeprefix("file://")).read_bytes())


def outcome(result: RunCheck) -> dict[str, str]:
    """name -> ok / FAIL / skip, for every check of the run part."""
    shown = {c.name: "ok" if c.ok else "FAIL" for c in result.checks if c.name in RUN_CHECK_NAMES}
    shown.update({c.name: "skip" for c in result.skipped})
    return shown


ALL_OK = {name: "ok" for name in RUN_CHECK_NAMES}


def test_a_sealed_run_recomputes_bit_for_bit(sealed: Sealed) -> None:
    progress: list[tuple[int, int]] = []
    result = verify_run(sealed.document, sealed.sources(), task_id=sealed.run.task_id,
                        on_round=lambda done, total: progress.append((done, total)))
    assert [c.name for c in result.checks] == ["task_id", *CHECK_NAMES, *RUN_CHECK_NAMES]
    assert result.ok, [c for c in result.checks if not c.ok]
    assert progress == [(1, 2), (2, 2)]
    assert result.get("payloads").detail == "12 accepted payload(s) hash to their signed hashes"  # type: ignore[union-attr]


@pytest.mark.parametrize(("overrides", "n_trainers", "equivocate"), [
    ({"aggregation": {"TrimmedMean": {"alpha_bps": 2500}}, "quorum": 4}, 5, None),
    ({"aggregation": {"Krum": {"f": 1}}, "quorum": 5}, 5, None),
    ({"aggregation": "CoordinateMedian"}, 3, None),
    ({}, 3, 1),  # Mean, trainer 1 slashed in round 1: its round-0 payloads stay in the record
])
def test_every_rule_and_a_slashed_trainer_recompute(
    tmp_path: Path, overrides: dict[str, Any], n_trainers: int, equivocate: int | None
) -> None:
    """The replay is the node's round update for every rule: the trim, Krum's selection and
    scores (the report hashes) and a slashed trainer's left-over payloads all reproduce."""
    run = run_to_sealed(tmp_path, n_trainers=n_trainers, spec_overrides=overrides, equivocate=equivocate,
                        equivocate_round=1)
    document = json.loads(json.dumps(run.service.get_receipt(run.task_id)))
    view = json.loads(json.dumps(run.service.get_run(run.task_id)))
    ref = TrainingTaskSpec.from_dict(view["spec"]).init_checkpoint()
    assert ref is not None
    sealed = Sealed(run, document, view, Path(ref.uri.removeprefix("file://")).read_bytes())
    result = verify_run(document, sealed.sources(), task_id=run.task_id)
    assert result.ok and outcome(result) == ALL_OK, [c for c in result.checks if not c.ok]
    records = run.receipt.transcript
    if "TrimmedMean" in str(overrides):
        assert all(o.trimmed == 1 for rec in records for o in rec.fragments)
    if equivocate is not None:
        assert any(t.slashed and t.accepted_submissions > 0 for t in run.receipt.trainers)


def test_without_a_model_source_the_model_file_is_not_compared(sealed: Sealed) -> None:
    result = verify_run(sealed.document, sealed.sources(model_file=None), task_id=sealed.run.task_id)
    assert result.ok and outcome(result) == {name: "ok" for name in RUN_CHECK_NAMES[:-1]}


def test_invalid_substituted_payload(sealed: Sealed) -> None:
    """A node serving another valid payload (another trainer's, same round and fragment) in place
    of the signed one: its hash is not the one signed."""
    def swapped(r: int, f: int, t: Address, max_bytes: int) -> bytes:
        accepted = sealed.run.receipt.transcript[r].fragments[f].accepted
        if (r, f, t) == (1, 0, accepted[0]):
            return sealed.stored_payload(r, f, accepted[1])
        return sealed.stored_payload(r, f, t)

    result = verify_run(sealed.document, sealed.sources(payload=swapped), task_id=sealed.run.task_id)
    assert outcome(result) == {**ALL_OK, "payloads": "FAIL", "rounds": "skip", "final_model_hash": "skip",
                               "model_file": "skip"}
    detail = result.get("payloads").detail  # type: ignore[union-attr]
    assert detail.startswith("round 1 fragment 0 trainer 0x") and "the trainer signed 0x" in detail


def test_invalid_payload_the_source_refuses_or_oversized(sealed: Sealed) -> None:
    def pruned(r: int, f: int, t: Address, max_bytes: int) -> bytes:
        raise ArtifactUnavailable("the node pruned the payload (HTTP 410)", 410)

    result = verify_run(sealed.document, sealed.sources(payload=pruned), task_id=sealed.run.task_id)
    assert outcome(result)["payloads"] == "FAIL" and not result.ok
    assert result.get("payloads").detail.endswith(": the node pruned the payload (HTTP 410)")  # type: ignore[union-attr]

    seen: list[int] = []

    def padded(r: int, f: int, t: Address, max_bytes: int) -> bytes:  # a source that ignores its bound
        seen.append(max_bytes)
        return b"\0" * (max_bytes + 1)

    result = verify_run(sealed.document, sealed.sources(payload=padded), task_id=sealed.run.task_id)
    assert "more than a payload of this fragment can be" in result.get("payloads").detail  # type: ignore[union-attr]
    assert seen and 0 < seen[0] < 64 << 10  # the bound comes from the fragment's layout (9 values here)


def test_parallel_fetches_report_the_first_failure_in_the_records_order(sealed: Sealed) -> None:
    """With downloads in flight at once, the verdict is the sequential one: the payload named is
    the first in canonical order that fails, not the first failure to come back."""
    import time
    from concurrent.futures import ThreadPoolExecutor

    first = sealed.run.receipt.transcript[0].fragments[0].accepted[0]

    def source(r: int, f: int, t: Address, max_bytes: int) -> bytes:
        if (r, f, t) == (0, 0, first):
            time.sleep(0.2)  # slow, and refused
            raise ArtifactUnavailable("the node does not serve the payload (HTTP 404)", 404)
        if (r, f) == (0, 1):
            return b"garbage"  # fast, and substituted
        return sealed.stored_payload(r, f, t)

    with ThreadPoolExecutor(8) as pool:
        parallel = verify_run(sealed.document, sealed.sources(payload=source, fetch_map=pool.map),
                              task_id=sealed.run.task_id)
        fine = verify_run(sealed.document, sealed.sources(fetch_map=pool.map), task_id=sealed.run.task_id)
    sequential = verify_run(sealed.document, sealed.sources(payload=source), task_id=sealed.run.task_id)
    assert parallel.get("payloads") == sequential.get("payloads")
    detail = parallel.get("payloads").detail  # type: ignore[union-attr]
    assert detail == f"round 0 fragment 0 trainer {format_address(first)}: the node does not serve the payload (HTTP 404)"
    assert fine.ok and outcome(fine) == ALL_OK


def test_invalid_wrong_checkpoint(sealed: Sealed, tmp_path: Path) -> None:
    other = bytearray(sealed.checkpoint)
    other[-1] ^= 1
    result = verify_run(sealed.document, sealed.sources(checkpoint=lambda n: bytes(other)), task_id=sealed.run.task_id)
    assert outcome(result) == {"spec": "ok", "checkpoint": "FAIL", **{n: "skip" for n in RUN_CHECK_NAMES[2:]}}
    assert "the spec says 0x" in result.get("checkpoint").detail  # type: ignore[union-attr]


def test_invalid_checkpoint_the_parser_refuses(sealed: Sealed) -> None:
    def refuse(data: bytes) -> Any:
        return parse_checkpoint_bytes(b"\0" * 8, "test")  # the right bytes, a refusing parse

    result = verify_run(sealed.document, sealed.sources(parse_checkpoint=refuse), task_id=sealed.run.task_id)
    assert outcome(result)["checkpoint"] == "FAIL" and "refused" in result.get("checkpoint").detail  # type: ignore[union-attr]


def test_invalid_initial_model_hash_the_node_states(sealed: Sealed) -> None:
    view = {**sealed.view, "initial_model_hash": "0x" + "00" * 32}
    result = verify_run(sealed.document, sealed.sources(run_view=lambda: view), task_id=sealed.run.task_id)
    assert outcome(result) == {"spec": "ok", "checkpoint": "ok", "initial_model": "FAIL",
                               **{n: "skip" for n in RUN_CHECK_NAMES[3:]}}


def test_invalid_spec_of_another_run(sealed: Sealed) -> None:
    spec = {**sealed.view["spec"], "max_rounds": sealed.view["spec"]["max_rounds"] + 1}
    result = verify_run(sealed.document, sealed.sources(run_view=lambda: {**sealed.view, "spec": spec}),
                        task_id=sealed.run.task_id)
    assert outcome(result) == {"spec": "FAIL", **{n: "skip" for n in RUN_CHECK_NAMES[1:]}}
    result = verify_run(sealed.document, sealed.sources(run_view=lambda: ["not", "a", "view"]), task_id=sealed.run.task_id)
    assert outcome(result)["spec"] == "FAIL"


def forged_document(sealed: Sealed, edit: Any) -> dict[str, Any]:
    """The document with its receipt rewritten self-consistently (run root, counts, ABI): what a
    node could serve that passes every receipt check, since a FinalizeRound signature covers
    only (task, round)."""
    receipt = rewritten_receipt(TrainingReceipt.from_dict(sealed.document["receipt"]), edit=edit)
    return {**sealed.document, "receipt": receipt.to_dict(), "run_root": "0x" + receipt.run_root.hex(),
            "abi": "0x" + encode_receipt(receipt).hex()}


def test_invalid_tampered_record_passes_the_receipt_checks_but_not_the_replay(sealed: Sealed) -> None:
    def forge(record: RoundRecord) -> RoundRecord:
        if record.round != 0:
            return record
        first = dataclasses.replace(record.fragments[1], aggregate_hash=b"\x07" * 32)
        return dataclasses.replace(record, fragments=(record.fragments[0], first, *record.fragments[2:]))

    result = verify_run(forged_document(sealed, forge), sealed.sources(), task_id=sealed.run.task_id)
    assert all(c.ok for c in result.checks if c.name not in RUN_CHECK_NAMES)  # verify-receipt is fooled
    assert outcome(result) == {"spec": "ok", "checkpoint": "ok", "initial_model": "ok", "payloads": "ok",
                               "rounds": "FAIL", "final_model_hash": "skip", "model_file": "skip"}
    assert result.get("rounds").detail.startswith(  # type: ignore[union-attr]
        "round 0 fragment 1 aggregate_hash: recomputed 0x")


def test_invalid_forged_final_model_hash(sealed: Sealed) -> None:
    """Both the last record's model hash and the final hash forged alike: round 1's replay
    gives the true hash."""
    def forge(record: RoundRecord) -> RoundRecord:
        last = len(sealed.run.receipt.transcript) - 1
        return dataclasses.replace(record, model_hash=b"\x09" * 32) if record.round == last else record

    result = verify_run(forged_document(sealed, forge), sealed.sources(), task_id=sealed.run.task_id)
    assert outcome(result)["rounds"] == "FAIL"
    assert "model hash: recomputed 0x" in result.get("rounds").detail  # type: ignore[union-attr]


def test_invalid_reordered_accepted_list(sealed: Sealed) -> None:
    """A record whose accepted trainers are out of canonical order cannot be decoded (inputs
    feed the rule in that order): the receipt is refused and nothing is downloaded."""
    doc = json.loads(json.dumps(sealed.document))
    accepted = doc["receipt"]["transcript"][0]["fragments"][0]["accepted"]
    accepted.reverse()
    asked: list[str] = []
    result = verify_run(doc, sealed.sources(run_view=lambda: asked.append("view")), task_id=sealed.run.task_id)
    assert [c.name for c in result.checks] == ["decode"] and not result.ok
    assert [c.name for c in result.skipped] == list(RUN_CHECK_NAMES) and asked == []
    with pytest.raises(Exception, match="strictly ascending"):
        FragmentOutcome(b"\0" * 32, tuple(bytes.fromhex(a[2:]) for a in accepted), 0, 0, b"\0" * 32)


def test_invalid_receipt_of_another_run_downloads_nothing(sealed: Sealed) -> None:
    asked: list[str] = []
    result = verify_run(sealed.document, sealed.sources(run_view=lambda: asked.append("view")), task_id="run-X")
    assert result.failed == ("task_id",) and asked == []
    assert all(c.detail.startswith("not run: the receipt does not verify (task_id)") for c in result.skipped)


def test_invalid_model_file_not_the_replayed_one(sealed: Sealed) -> None:
    def tampered(size: int) -> bytes:
        data = bytearray(sealed.run.service.export_final_model(sealed.run.task_id))
        data[-1] ^= 1
        return bytes(data)

    result = verify_run(sealed.document, sealed.sources(model_file=tampered), task_id=sealed.run.task_id)
    assert outcome(result) == {**ALL_OK, "model_file": "FAIL"}


def test_a_transport_failure_of_a_source_propagates(sealed: Sealed) -> None:
    """Only ArtifactUnavailable is a failed check: anything else (the CLI's unreachable node)
    is the caller's to report."""
    class Down(Exception):
        pass

    def down(r: int, f: int, t: Address, max_bytes: int) -> bytes:
        raise Down()

    with pytest.raises(Down):
        verify_run(sealed.document, sealed.sources(payload=down), task_id=sealed.run.task_id)


# --- the check list, its stops, and the sources' contracts -------------------------------------


def _initial(sealed: Sealed) -> Any:
    from tenzro_training.run_replay import check_initial_model

    spec = TrainingTaskSpec.from_dict(sealed.view["spec"])
    result, initial = check_initial_model(spec, parse_checkpoint_bytes(sealed.checkpoint, "test"), sealed.view)
    assert result.ok and initial is not None
    return initial


def _receipt_and_attestations(sealed: Sealed) -> tuple[TrainingReceipt, Any]:
    from tenzro_training.receipt_check import Attestations

    return (TrainingReceipt.from_dict(sealed.document["receipt"]),
            Attestations.from_dict(sealed.document["attestations"]))


def test_a_run_check_is_ok_only_with_checks_all_passed_and_none_skipped() -> None:
    from tenzro_training.receipt_check import CheckResult

    passed, failed = CheckResult("spec", True, "fine"), CheckResult("rounds", False, "not run")
    assert RunCheck((passed,)).ok
    assert not RunCheck(()).ok  # nothing checked proves nothing
    assert not RunCheck((passed,), (failed,)).ok
    assert RunCheck((passed, CheckResult("payloads", False, "x"))).failed == ("payloads",)


@pytest.mark.parametrize("view", [{}, {"spec": 5}, {"spec": None}, {"spec": ["a"]}, {"spec": {"version": 1}}])
def test_invalid_getrun_answer_without_a_spec_that_parses(sealed: Sealed, view: dict[str, Any]) -> None:
    result = verify_run(sealed.document, sealed.sources(run_view=lambda: view), task_id=sealed.run.task_id)
    assert outcome(result) == {"spec": "FAIL", **{n: "skip" for n in RUN_CHECK_NAMES[1:]}}
    assert "getRun's spec does not parse" in result.get("spec").detail  # type: ignore[union-attr]


def test_invalid_getrun_unavailable_fails_the_spec_check_once(sealed: Sealed) -> None:
    def gone() -> object:
        raise ArtifactUnavailable("getRun: HTTP 404", 404)

    result = verify_run(sealed.document, sealed.sources(run_view=gone), task_id=sealed.run.task_id)
    assert [c.name for c in result.checks if c.name in RUN_CHECK_NAMES] == ["spec"]
    assert result.get("spec").detail == "no getRun answer: getRun: HTTP 404"  # type: ignore[union-attr]
    assert [c.name for c in result.skipped] == list(RUN_CHECK_NAMES[1:])


def test_without_a_model_source_a_stop_skips_no_model_file_check(sealed: Sealed) -> None:
    other = bytearray(sealed.checkpoint)
    other[-1] ^= 1
    result = verify_run(sealed.document, sealed.sources(model_file=None, checkpoint=lambda n: bytes(other)),
                        task_id=sealed.run.task_id)
    assert [c.name for c in result.skipped] == list(RUN_CHECK_NAMES[2:-1])


def test_invalid_initial_model_view_that_is_not_a_mapping(sealed: Sealed) -> None:
    from tenzro_training.run_replay import check_initial_model

    spec = TrainingTaskSpec.from_dict(sealed.view["spec"])
    state = parse_checkpoint_bytes(sealed.checkpoint, "test")
    for view in (["not", "a", "view"], None):
        result, initial = check_initial_model(spec, state, view)
        assert not result.ok and initial is None
        assert "initial_model_hash" in result.detail


def test_sources_are_asked_for_at_most_what_each_artifact_can_be(sealed: Sealed) -> None:
    from tenzro_training.payload import compute_max_payload_bytes

    bounds = {lay.index: compute_max_payload_bytes(lay) for lay in _initial(sealed).model.layouts}
    asked: list[tuple[int, int]] = []
    sizes: list[int] = []

    def payload(r: int, f: int, t: Address, max_bytes: int) -> bytes:
        asked.append((f, max_bytes))
        return sealed.stored_payload(r, f, t)

    def model_file(size: int) -> bytes:
        sizes.append(size)
        return sealed.run.service.export_final_model(sealed.run.task_id)

    result = verify_run(sealed.document, sealed.sources(payload=payload, model_file=model_file),
                        task_id=sealed.run.task_id)
    assert result.ok
    assert asked and all(max_bytes == bounds[f] for f, max_bytes in asked)
    assert sizes == [len(sealed.run.service.export_final_model(sealed.run.task_id))]


def test_invalid_payload_of_exactly_the_bound_is_checked_by_its_hash(sealed: Sealed) -> None:
    def full(r: int, f: int, t: Address, max_bytes: int) -> bytes:
        return b"\0" * max_bytes  # as large as a payload of the fragment may be: not refused for size

    result = verify_run(sealed.document, sealed.sources(payload=full), task_id=sealed.run.task_id)
    assert outcome(result)["payloads"] == "FAIL"
    assert "the bytes served hash to 0x" in result.get("payloads").detail  # type: ignore[union-attr]


def test_a_payload_source_error_other_than_unavailable_propagates(sealed: Sealed) -> None:
    from tenzro_training.errors import EncodingError

    def broken(r: int, f: int, t: Address, max_bytes: int) -> bytes:
        raise EncodingError("the transport's framing broke")

    with pytest.raises(EncodingError, match="framing"):
        verify_run(sealed.document, sealed.sources(payload=broken), task_id=sealed.run.task_id)


def test_replay_run_leaves_the_initial_model_untouched(sealed: Sealed) -> None:
    from tenzro_training.run_replay import replay_run

    initial = _initial(sealed)
    before = [w.clone() for w in initial.weights]
    receipt, attestations = _receipt_and_attestations(sealed)
    replay = replay_run(receipt, attestations, initial, lambda r, f, t, n: sealed.stored_payload(r, f, t))
    assert replay.rounds is not None and replay.rounds.ok and replay.weights is not None
    assert all(torch.equal(a, b) for a, b in zip(initial.weights, before))
    assert not all(torch.equal(a, b) for a, b in zip(replay.weights, before))


def test_replay_of_a_submission_without_an_attested_hash_downloads_nothing(sealed: Sealed) -> None:
    from tenzro_training.run_replay import replay_run

    receipt, attestations = _receipt_and_attestations(sealed)
    first = attestations.rounds[0]
    missing = first.submissions[0]
    unattested = dataclasses.replace(attestations, rounds=(
        dataclasses.replace(first, submissions=first.submissions[1:]), *attestations.rounds[1:]))
    asked: list[object] = []
    replay = replay_run(receipt, unattested, _initial(sealed), lambda *job: asked.append(job) or b"")
    assert not replay.payloads.ok and replay.rounds is None and asked == []
    assert replay.payloads.detail == (f"round 0 fragment {missing.fragment} trainer {format_address(missing.trainer)}: "
                                      "no signed payload hash attested")


def test_a_replay_stopped_early_says_which_rounds_its_payloads_cover(sealed: Sealed) -> None:
    def forge(record: RoundRecord) -> RoundRecord:
        if record.round != 0:
            return record
        return dataclasses.replace(record, fragments=(
            dataclasses.replace(record.fragments[0], aggregate_hash=b"\x07" * 32), *record.fragments[1:]))

    result = verify_run(forged_document(sealed, forge), sealed.sources(), task_id=sealed.run.task_id)
    assert outcome(result)["rounds"] == "FAIL"
    round0 = sum(len(o.accepted) for o in sealed.run.receipt.transcript[0].fragments)
    assert result.get("payloads").detail == (  # type: ignore[union-attr]
        f"{round0} accepted payload(s) hash to their signed hashes (of rounds 0..0: the replay stopped there)")


def test_a_round_whose_signed_payloads_do_not_decode_stops_the_replay(sealed: Sealed) -> None:
    from tenzro_training.payload import compute_payload_hash
    from tenzro_training.run_replay import replay_run

    receipt, attestations = _receipt_and_attestations(sealed)
    junk = b"not a payload"
    first = attestations.rounds[0]
    victim = first.submissions[0]
    signed_junk = dataclasses.replace(attestations, rounds=(
        dataclasses.replace(first, submissions=(dataclasses.replace(victim, payload_hash=compute_payload_hash(junk)),
                                                *first.submissions[1:])), *attestations.rounds[1:]))

    def source(r: int, f: int, t: Address, n: int) -> bytes:
        return junk if (r, f, t) == (0, victim.fragment, victim.trainer) else sealed.stored_payload(r, f, t)

    replay = replay_run(receipt, signed_junk, _initial(sealed), source)
    assert replay.rounds is not None and not replay.rounds.ok and replay.weights is None
    assert replay.rounds.detail.startswith("round 0 cannot be recomputed: ")
    round0 = sum(len(o.accepted) for o in receipt.transcript[0].fragments)
    assert replay.payloads.ok and replay.payloads.detail == (
        f"{round0} accepted payload(s) hash to their signed hashes (of rounds 0..0: the replay stopped there)")


def test_checkpoint_source_bounds(sealed: Sealed) -> None:
    size = len(sealed.checkpoint)
    asked: list[int] = []

    def checkpoint(max_bytes: int) -> bytes:
        asked.append(max_bytes)
        return sealed.checkpoint  # a source that ignores its bound

    exact = verify_run(sealed.document, sealed.sources(checkpoint=checkpoint, max_checkpoint_bytes=size),
                       task_id=sealed.run.task_id)
    assert exact.ok and asked == [size]  # exactly the limit is within it
    over = verify_run(sealed.document, sealed.sources(checkpoint=checkpoint, max_checkpoint_bytes=size - 1),
                      task_id=sealed.run.task_id)
    assert outcome(over) == {"spec": "ok", "checkpoint": "FAIL", **{n: "skip" for n in RUN_CHECK_NAMES[2:]}}
    assert over.get("checkpoint").detail == f"{size} bytes, more than {size - 1}"  # type: ignore[union-attr]


def test_invalid_checkpoint_or_model_file_unavailable(sealed: Sealed) -> None:
    def gone(size: int) -> bytes:
        raise ArtifactUnavailable("not served (HTTP 404)", 404)

    result = verify_run(sealed.document, sealed.sources(checkpoint=gone), task_id=sealed.run.task_id)
    assert outcome(result)["checkpoint"] == "FAIL"
    assert result.get("checkpoint").detail == "not served (HTTP 404)"  # type: ignore[union-attr]
    result = verify_run(sealed.document, sealed.sources(model_file=gone), task_id=sealed.run.task_id)
    assert outcome(result) == {**ALL_OK, "model_file": "FAIL"}
    assert result.get("model_file").detail == "not served (HTTP 404)"  # type: ignore[union-attr]


def test_invalid_spec_naming_no_init_checkpoint(sealed: Sealed) -> None:
    from tenzro_training.run_replay import _check_checkpoint

    raw = json.loads(json.dumps(sealed.view["spec"]))
    raw["architecture"]["metadata"].pop("init_checkpoint")
    spec = TrainingTaskSpec.from_dict(raw)
    assert spec.init_checkpoint() is None
    result, state = _check_checkpoint(spec, sealed.sources())
    assert not result.ok and state is None
    assert result.detail == "the spec names no architecture.metadata.init_checkpoint"
