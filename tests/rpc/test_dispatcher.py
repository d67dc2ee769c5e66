"""The in-process dispatcher: the conformance suite plus dispatcher- and table-level unit tests."""

from __future__ import annotations

import base64
import json
import logging
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import rpc.params as params_module
from rpc.dispatcher import MAX_NESTING, MAX_VALUES, METHODS, Dispatcher, parse_json, serialize_json
from rpc.errors import (
    ERROR_TABLE,
    INTERNAL_ERROR,
    InvalidParams,
    ParseError,
    compute_error_object,
    get_codes,
    get_error_entry,
)
from rpc.params import PARAMS_BY_METHOD
from rpc.service import TrainingService
from tenzro_training.errors import RunError, TenzroError, UnknownTask
from tests.rpc.conformance import FakeService, RpcConformance, get_run, req

DOCS = Path(__file__).resolve().parents[2] / "docs" / "rpc.md"


class TestDispatcherConformance(RpcConformance):
    @pytest.fixture
    def service(self) -> Iterator[FakeService]:
        fake = FakeService()
        self._dispatcher = Dispatcher(fake)
        yield fake

    def call_raw(self, raw: bytes) -> Any:
        answer = self._dispatcher.handle(raw)
        if answer is None:
            return None
        assert type(answer) is bytes
        return json.loads(answer)


# -- dispatcher API -----------------------------------------------------------------------------


def test_fake_service_satisfies_the_protocol() -> None:
    assert isinstance(FakeService(), TrainingService)


SERVICE_METHODS = ("post_task", "list_runs", "get_run", "get_run_json", "get_receipt", "get_receipt_json",
                   "enroll_trainer", "submit_outer_gradient", "finalize_round", "cancel_task")


@pytest.mark.parametrize("missing", SERVICE_METHODS)
def test_a_service_missing_a_method_is_not_a_training_service(missing: str) -> None:
    """The Protocol is the transport's whole contract with the node: every method a route calls
    is in it, so a service lacking one fails the isinstance check up front instead of answering
    -32603 at its first request."""
    methods = {name: lambda self, *args: {} for name in SERVICE_METHODS}
    assert isinstance(type("Complete", (), methods)(), TrainingService)
    del methods[missing]
    assert not isinstance(type("Partial", (), methods)(), TrainingService)


def test_every_method_has_params_and_a_route() -> None:
    assert set(METHODS) == set(PARAMS_BY_METHOD)
    assert len(METHODS) == 8
    assert all(name.startswith("tenzro_training_") for name in METHODS)


def test_handle_accepts_str_and_bytes() -> None:
    dispatcher = Dispatcher(FakeService())
    text = json.dumps(get_run())
    assert dispatcher.handle(text) == dispatcher.handle(text.encode())


def test_a_batch_over_the_limit_is_refused_whole_before_any_element_runs() -> None:
    service = FakeService()
    dispatcher = Dispatcher(service, max_batch=3)
    answer = json.loads(dispatcher.handle(json.dumps([get_run(id=i) for i in range(4)])))
    assert answer["error"]["code"] == -32600 and answer["id"] is None
    assert "4 requests; at most 3" in answer["error"]["message"]
    assert service.calls == []
    answer = json.loads(dispatcher.handle(json.dumps([get_run(id=i) for i in range(3)])))
    assert [a["id"] for a in answer] == [0, 1, 2] and len(service.calls) == 3
    # The default holds 1000, and a non-request element counts like any other.
    assert len(json.loads(Dispatcher(FakeService()).handle(json.dumps([1] * 1000)))) == 1000
    assert json.loads(Dispatcher(FakeService()).handle(json.dumps([1] * 1001)))["error"]["code"] == -32600
    for bad in (0, -1, 1.5, True, "3"):
        with pytest.raises(ValueError):
            Dispatcher(FakeService(), max_batch=bad)  # type: ignore[arg-type]


def test_handle_obj_is_dict_in_dict_out() -> None:
    dispatcher = Dispatcher(FakeService())
    assert dispatcher.handle_obj(get_run(id=3)) == {
        "jsonrpc": "2.0", "result": {"method": "get_run", "task_id": "t1"}, "id": 3,
    }
    assert dispatcher.handle_obj({"jsonrpc": "2.0", "method": "tenzro_training_getRun",
                                  "params": {"task_id": "t1"}}) is None
    answer = dispatcher.handle_obj([get_run(id=1), 5])
    assert isinstance(answer, list) and answer[1]["error"]["code"] == -32600


def test_output_is_compact_ascii_json() -> None:
    service = FakeService()
    service.result = {"name": "ünïcode", "n": 1}
    answer = Dispatcher(service).handle(json.dumps(get_run()))
    assert answer is not None
    answer.decode("ascii")
    assert b": " not in answer and b", " not in answer
    assert json.loads(answer)["result"]["name"] == "ünïcode"


def test_a_batch_splices_service_serialized_results_and_isolates_unserializable_ones() -> None:
    """getRun's result arrives serialized (JsonText) and is spliced in; the body is still one
    compact JSON array, and a result that cannot be serialized fails its element only."""
    service = FakeService()
    dispatcher = Dispatcher(service)
    list_runs = {"jsonrpc": "2.0", "method": "tenzro_training_listRuns", "params": {}, "id": "b"}
    body = json.dumps([get_run(id=1), list_runs, get_run(id=None), 7])
    answer = dispatcher.handle(body)
    assert answer is not None
    parsed = json.loads(answer)
    assert answer == serialize_json(parsed)
    assert [a["id"] for a in parsed] == [1, "b", None, None]
    assert parsed[0]["result"] == parsed[2]["result"] == {"method": "get_run", "task_id": "t1"}
    assert parsed[1]["result"]["method"] == "list_runs" and parsed[3]["error"]["code"] == -32600
    service.result = {"raw": b"\x00"}
    parsed = json.loads(dispatcher.handle(body) or b"")
    assert [a["error"]["code"] for a in parsed] == [INTERNAL_ERROR, INTERNAL_ERROR, INTERNAL_ERROR, -32600]
    assert [a["id"] for a in parsed] == [1, "b", None, None]


def test_unexpected_exception_is_logged_with_traceback(caplog: pytest.LogCaptureFixture) -> None:
    service = FakeService()
    service.error = RuntimeError("the secret detail")
    with caplog.at_level(logging.ERROR, logger="rpc.dispatcher"):
        answer = Dispatcher(service).handle(json.dumps(get_run()))
    assert answer is not None and b"secret" not in answer
    assert any(r.exc_info and "the secret detail" in str(r.exc_info[1]) for r in caplog.records)


def test_tenzro_errors_are_not_logged_as_internal(caplog: pytest.LogCaptureFixture) -> None:
    service = FakeService()
    service.error = UnknownTask("t1")
    with caplog.at_level(logging.ERROR, logger="rpc.dispatcher"):
        Dispatcher(service).handle(json.dumps(get_run()))
    assert caplog.records == []


def test_a_non_public_refusal_is_logged_for_the_operator(caplog: pytest.LogCaptureFixture) -> None:
    """A CheckpointError reaches the client as its table message only (its reason may name
    node-local files); the node's log was silent, so an operator could not see why a postTask
    (e.g. a fragment_count above the model's element count) was refused. Public refusals stay
    out of the log: a client can cause any number of them."""
    from tenzro_training.errors import CheckpointError

    service = FakeService()
    service.error = CheckpointError("file:///srv/ck.safetensors", "cannot split into fragments: 18 > 17 elements")
    with caplog.at_level(logging.WARNING, logger="rpc.dispatcher"):
        answer = Dispatcher(service).handle(json.dumps(get_run()))
    assert answer is not None and b"/srv/ck" not in answer and b"18 > 17" not in answer
    assert [r.levelno for r in caplog.records] == [logging.WARNING]
    assert "cannot split into fragments: 18 > 17 elements" in caplog.records[0].getMessage()
    caplog.clear()
    service.error = UnknownTask("t1")
    with caplog.at_level(logging.WARNING, logger="rpc.dispatcher"):
        Dispatcher(service).handle(json.dumps(get_run()))
    assert caplog.records == []


def test_a_public_refusal_names_its_task_at_debug_level_only(caplog: pytest.LogCaptureFixture) -> None:
    """A client can cause any number of public refusals, so they stay out of the log at INFO;
    at DEBUG an operator asked why a trainer was refused finds the call with its task id,
    quoted (the client's text: no line breaks into the log)."""
    service = FakeService()
    service.error = UnknownTask("t1\nforged line")
    with caplog.at_level(logging.INFO, logger="rpc.dispatcher"):
        Dispatcher(service).handle(json.dumps(get_run("t1\nforged line")))
    assert caplog.records == []
    with caplog.at_level(logging.DEBUG, logger="rpc.dispatcher"):
        Dispatcher(service).handle(json.dumps(get_run("t1\nforged line")))
        Dispatcher(service).handle(json.dumps(req("tenzro_training_listRuns", {}, 2)))
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2 and all("\n" not in line for line in lines)
    assert lines[0].startswith('JSON-RPC "tenzro_training_getRun" refused with ') and ' for task "t1\\nforged line": ' in lines[0]
    assert " for task -: " in lines[1]


# -- strict JSON ----------------------------------------------------------------------------------


def test_parse_json_accepts_plain_json() -> None:
    assert parse_json(b'{"a": [1, 2.5, "x", null, true]}') == {"a": [1, 2.5, "x", None, True]}
    assert parse_json('{"big": ' + "9" * 100 + "}") == {"big": int("9" * 100)}


@pytest.mark.parametrize(("raw", "reason"), [
    (b'{"a":1,"a":2}', "duplicate object key 'a'"),
    (b"[NaN]", "NaN is not JSON"),
    (b"[1e999]", "number out of the finite double range"),
    (b"[" + b"1" * 101 + b"]", "integer literal longer than 100 characters"),
    (b"\x80", "body is not UTF-8"),
    (b"[" * (MAX_NESTING + 1) + b"]" * (MAX_NESTING + 1), f"nesting deeper than {MAX_NESTING} levels"),
])
def test_invalid_parse_json_reasons(raw: bytes, reason: str) -> None:
    with pytest.raises(ParseError) as info:
        parse_json(raw)
    assert info.value.reason == reason


def test_invalid_parse_json_position() -> None:
    with pytest.raises(ParseError) as info:
        parse_json(b'{"a": }')
    assert info.value.position == 6
    assert info.value.reason.startswith("invalid JSON")


def test_invalid_more_values_than_the_cap_are_refused_before_parsing(monkeypatch: pytest.MonkeyPatch) -> None:
    """A 64 MiB body of tiny objects (~100 KB gzipped) cost 2.2 GiB and 9 s to parse; the
    values are counted first and such a body is never parsed."""
    import rpc.dispatcher as dispatcher

    at_cap = b"[" + b"0," * (MAX_VALUES - 2) + b"0]"  # the array and MAX_VALUES - 1 elements
    assert len(parse_json(at_cap)) == MAX_VALUES - 1

    class NoParse:
        def decode(self, text: str) -> None:
            raise AssertionError("parsed")

    monkeypatch.setattr(dispatcher, "_DECODER", NoParse())
    for over in (b"[" + b"0," * MAX_VALUES + b"0]", b"[" + b'{"":0},' * MAX_VALUES + b"1]"):
        with pytest.raises(ParseError) as info:
            parse_json(over)
        assert info.value.reason == f"more than {MAX_VALUES} JSON values"
    answer = json.loads(Dispatcher(FakeService()).handle(b"[" + b'{"":0},' * MAX_VALUES + b"1]", 1 << 20))
    assert answer["error"]["code"] == -32700 and str(MAX_VALUES) in answer["error"]["message"]


def test_nesting_exactly_at_the_limit_is_accepted() -> None:
    assert parse_json("[" * MAX_NESTING + "]" * MAX_NESTING) is not None


def test_invalid_lone_surrogate_text() -> None:
    with pytest.raises(ParseError):
        parse_json('"\ud800"[')


# -- the error table ----------------------------------------------------------------------------


def test_table_codes_are_unique_and_outside_reserved_range() -> None:
    codes = [row.code for row in ERROR_TABLE]
    assert len(codes) == len(set(codes))
    standard = {-32700, -32600, -32601, -32602, -32603}
    for code in codes:
        assert code in standard or not -32768 <= code <= -32000


def test_subclass_falls_back_through_the_mro() -> None:
    class Late(UnknownTask):
        pass

    class Other(TenzroError, KeyError):
        pass

    assert get_error_entry(Late).code == get_error_entry(UnknownTask).code == 1301
    assert get_error_entry(Other).code == 1000
    assert get_error_entry(KeyError).code == INTERNAL_ERROR
    assert get_error_entry(RunError).code == 1300


def test_error_object_never_raises_on_hostile_exceptions() -> None:
    class Hostile(UnknownTask):
        def __str__(self) -> str:
            raise RuntimeError("no")

    error = compute_error_object(Hostile("t1"))
    assert error["code"] == 1301 and error["data"] == {"type": "Hostile"}
    assert compute_error_object(KeyboardInterrupt())["code"] == INTERNAL_ERROR


def test_error_data_filters_unsafe_attributes() -> None:
    exc = UnknownTask("t1")
    exc.where = "/home/node/data"  # type: ignore[attr-defined]
    exc.uri = "file:///x"  # type: ignore[attr-defined]
    exc.win = "C:\\node"  # type: ignore[attr-defined]
    exc.blob = b"\x00" * 1000  # type: ignore[attr-defined]
    exc.long = "x" * 1000  # type: ignore[attr-defined]
    exc.obj = object()  # type: ignore[attr-defined]
    exc._private = 1  # type: ignore[attr-defined]
    exc.flag = True  # type: ignore[attr-defined]
    exc.huge = -(2**60)  # type: ignore[attr-defined]
    data = compute_error_object(exc)["data"]
    assert data == {"type": "UnknownTask", "task_id": "t1", "flag": True, "huge": str(-(2**60))}


def test_error_message_is_cut() -> None:
    error = compute_error_object(UnknownTask("t" * 2000))
    assert len(error["message"]) == 512


def test_error_data_limits_are_inclusive() -> None:
    """Each bound of data admits its own size and drops one more: 256 characters, 128 bytes,
    256 ints; +-(2^53 - 1) are numbers, +-2^53 decimal strings, in a list too."""
    exc = UnknownTask("t1")
    exc.s_ok, exc.s_long = "x" * 256, "x" * 257  # type: ignore[attr-defined]
    exc.b_ok, exc.b_long = b"\x01" * 128, b"\x01" * 129  # type: ignore[attr-defined]
    exc.seq_ok, exc.seq_long = list(range(256)), tuple(range(257))  # type: ignore[attr-defined]
    exc.safe, exc.neg_safe = 2**53 - 1, -(2**53 - 1)  # type: ignore[attr-defined]
    exc.unsafe, exc.neg_unsafe = 2**53, -(2**53)  # type: ignore[attr-defined]
    exc.amounts = [2**53, -(2**53), 2**53 - 1]  # type: ignore[attr-defined]
    data = compute_error_object(exc)["data"]
    assert data == {
        "type": "UnknownTask", "task_id": "t1", "s_ok": "x" * 256, "b_ok": "0x" + "01" * 128,
        "seq_ok": list(range(256)), "safe": 2**53 - 1, "neg_safe": -(2**53 - 1), "unsafe": str(2**53),
        "neg_unsafe": str(-(2**53)), "amounts": [str(2**53), str(-(2**53)), 2**53 - 1],
    }


def test_error_data_never_sends_home_paths_file_uris_or_a_forged_type() -> None:
    """Any case of a file URI and a home path are dropped like absolute paths; an attribute
    named ``type`` cannot replace the class name; a list holding anything but ints (a path, a
    bool) is dropped alone, the other attributes still sent; a bool stays a JSON boolean."""
    exc = UnknownTask("t1")
    exc.uri = "FILE:///var/lib/node"  # type: ignore[attr-defined]
    exc.home = "~/node/data"  # type: ignore[attr-defined]
    exc.type = "Spoofed"  # type: ignore[attr-defined]
    exc.names = ["/etc/passwd"]  # type: ignore[attr-defined]
    exc.flags = (1, True)  # type: ignore[attr-defined]
    exc.flag = True  # type: ignore[attr-defined]
    data = compute_error_object(exc)["data"]
    assert data == {"type": "UnknownTask", "task_id": "t1", "flag": True}
    assert json.dumps(data["flag"]) == "true"


def test_an_exception_outside_the_tree_is_an_anonymous_internal_error() -> None:
    """Whoever calls compute_error_object, a non-Tenzro exception's class and text stay on the node."""
    assert compute_error_object(KeyError("/var/lib/node/secret")) == {
        "code": INTERNAL_ERROR, "message": "internal error", "data": {"type": "InternalError"}}
    assert compute_error_object(TenzroError("/var/lib/node/secret")) == {
        "code": 1000, "message": "request failed", "data": {"type": "TenzroError"}}


def test_an_empty_public_text_is_answered_with_the_rows_message() -> None:
    from tenzro_training.auth import AuthError

    assert compute_error_object(AuthError()) == {"code": 1200, "message": "authentication failed",
                                                 "data": {"type": "AuthError"}}


def test_a_parse_error_at_the_first_character_says_where() -> None:
    assert str(ParseError("invalid JSON", 0)) == "parse error: invalid JSON at character 0"
    assert compute_error_object(ParseError("invalid JSON", 0))["data"]["position"] == 0


def test_docs_list_every_code() -> None:
    text = DOCS.read_text()
    rows = dict(re.findall(r"^\|\s*`?(-?\d+)`?\s*\|\s*`(\w+)`", text, flags=re.MULTILINE))
    assert {name: code for code, name in rows.items()} == {k: str(v) for k, v in get_codes().items()}


# -- strict base64: every available decoder behaves the same ----------------------------------


def _strict_b64(text: str, name: str) -> bytes | None:
    try:
        return params_module._payload(text, params_module.B64_DECODERS[name])
    except InvalidParams:
        return None


@settings(max_examples=300, deadline=None)
@given(data=st.binary(min_size=1, max_size=64))
def test_b64_round_trip_every_decoder(data: bytes) -> None:
    text = base64.b64encode(data).decode()
    for name in params_module.B64_DECODERS:
        assert _strict_b64(text, name) == data


@settings(max_examples=500, deadline=None)
@given(text=st.text(alphabet="ABCDQRSTabyz0189+/=-_ \n\u00e9", max_size=16))
@example(text="AAAA====")  # binascii's strict mode took it and the canonical-bits check crashed
@example(text="QUJD====")
@example(text="====")
def test_b64_decoders_agree_and_accept_only_canonical(text: str) -> None:
    results = {name: _strict_b64(text, name) for name in params_module.B64_DECODERS}
    assert len(set(results.values())) == 1, results
    decoded = results["binascii"]
    if decoded is not None:  # accepted only if it is THE encoding of what it decodes to
        assert base64.b64encode(decoded).decode() == text


@pytest.mark.parametrize("decoder", sorted(params_module.B64_DECODERS))
def test_payload_padding_is_counted_from_the_end(decoder: str) -> None:
    """Zero, one or two '=' decode; three or more are refused as such, whatever comes before."""
    for text, data in (("QUJD", b"ABC"), ("QUI=", b"AB"), ("QQ==", b"A"), ("QUJDQQ==", b"ABCA")):
        assert params_module._payload(text, params_module.B64_DECODERS[decoder]) == data
    for bad in ("AAAA====", "QUJD====", "Q===", "========"):
        with pytest.raises(InvalidParams, match="more than two '='"):
            params_module._payload(bad, params_module.B64_DECODERS[decoder])


@pytest.mark.parametrize("decoder", sorted(params_module.B64_DECODERS))
def test_invalid_payload_base64_with_any_unused_bit_set(decoder: str) -> None:
    """One '=' leaves 2 unused bits, two '=' leave 4: every one of them must be zero."""
    for text, data in (("QQ==", b"A"), ("QUI=", b"AB")):
        assert _strict_b64(text, decoder) == data
    for bad in ("QR==", "QS==", "QU==", "QY==", "Qc==", "Q0==", "QUJ=", "QUK="):
        assert _strict_b64(bad, decoder) is None, bad
    with pytest.raises(InvalidParams, match="unused bits"):
        params_module._payload("QU==", params_module.B64_DECODERS[decoder])


@pytest.mark.parametrize(
    "value, kind",
    [(5, "integer"), (1.5, "number"), (True, "boolean"), (None, "null"), ([], "array"), ({}, "object"),
     (b"run", "bytes")],
)
def test_invalid_params_reason_names_the_json_type_it_got(value: object, kind: str) -> None:
    with pytest.raises(InvalidParams) as err:
        params_module.GetRunParams.parse({"task_id": value})
    assert err.value.param == "task_id" and err.value.reason == f"expected a string, got {kind}"


def test_smallest_dispatcher_limits_are_allowed_and_bad_ones_refused() -> None:
    service = FakeService()
    dispatcher = Dispatcher(service, max_batch=1, max_answer_bytes=1)
    answer = json.loads(dispatcher.handle(json.dumps([get_run(id=7)])))
    assert [a["id"] for a in answer] == [7] and len(service.calls) == 1
    assert json.loads(dispatcher.handle(json.dumps([get_run(id=1)] * 2)))["error"]["code"] == -32600
    Dispatcher(FakeService(), max_batch_seconds=3)  # an int is a number of seconds too
    for bad in (0, -1, 1.5, True, "3"):
        with pytest.raises(ValueError, match="max_answer_bytes"):
            Dispatcher(FakeService(), max_answer_bytes=bad)  # type: ignore[arg-type]
    for bad_seconds in (0, 0.0, -1.0, float("inf"), float("nan"), True, "2"):
        with pytest.raises(ValueError, match="max_batch_seconds"):
            Dispatcher(FakeService(), max_batch_seconds=bad_seconds)  # type: ignore[arg-type]


def test_invalid_json_parsed_too_close_to_the_recursion_limit_is_a_parse_error() -> None:
    """Nesting within MAX_NESTING can still exhaust the interpreter's recursion limit when the
    caller's stack is already deep: a parse error, never a wrong value (such as None)."""
    import inspect
    import sys

    text = "[" * MAX_NESTING + "]" * MAX_NESTING
    expected = parse_json(text)

    def at_depth(n: int) -> object:
        if n:
            return at_depth(n - 1)
        try:
            return parse_json(text) == expected
        except ParseError as exc:
            return str(exc)

    old = sys.getrecursionlimit()
    base = len(inspect.stack())
    sys.setrecursionlimit(base + 400)
    try:
        outcomes = [at_depth(400 - room) for room in range(380, 0, -20)]
    finally:
        sys.setrecursionlimit(old)
    assert set(outcomes) == {True, "parse error: nesting too deep"}


def test_a_batch_answer_exactly_at_its_cap_still_runs_the_next_element() -> None:
    """The cap refuses the rest once the answer holds MORE than max_answer_bytes."""
    first = Dispatcher(FakeService()).handle(json.dumps([get_run(id=0)]))
    assert first is not None
    cap = len(first) - 2 + 1  # one element's text plus its separator, as the batch counts it
    service = FakeService()
    answer = json.loads(Dispatcher(service).handle(json.dumps([get_run(id=0), get_run(id=1), get_run(id=2)]),
                                                   max_answer_bytes=cap) or b"")
    assert [("result" in a) for a in answer] == [True, True, False] and len(service.calls) == 2


def test_elements_refused_by_a_batch_limit_are_each_answered_except_notifications() -> None:
    service = FakeService()
    notification = {"jsonrpc": "2.0", "method": "tenzro_training_getRun", "params": {"task_id": "n"}}
    batch = [get_run(id=0), 5, "x", [1], notification, {"id": "s", "method": 3}, get_run(id=9)]
    answer = json.loads(Dispatcher(service).handle(json.dumps(batch), max_answer_bytes=1) or b"")
    assert [a["id"] for a in answer] == [0, None, None, None, "s", 9]
    assert all(a["error"]["code"] == 1800 for a in answer[1:]) and len(service.calls) == 1


def test_request_durations_recorded_are_the_time_spent_in_the_call() -> None:
    from rpc.metrics import Registry, RpcMetrics

    registry = Registry()
    dispatcher = Dispatcher(FakeService(), metrics=RpcMetrics(registry, METHODS))
    dispatcher.handle(json.dumps(get_run(id=1)))  # a result
    dispatcher.handle(json.dumps({"jsonrpc": "2.0", "method": "tenzro_training_getRun", "params": {}, "id": 2}))  # refused
    text = registry.render().decode()
    line = next(x for x in text.splitlines()
                if x.startswith('tenzro_rpc_request_duration_seconds_sum{method="tenzro_training_getRun"}'))
    assert 0 <= float(line.split()[-1]) < 10
    assert 'tenzro_rpc_request_duration_seconds_count{method="tenzro_training_getRun"} 2' in text


def _dispatcher_on_a_held_clock(monkeypatch: pytest.MonkeyPatch) -> tuple[FakeService, Dispatcher, list[float]]:
    """A dispatcher over a FakeService whose ``time.monotonic`` reads ``now[0]`` (the log bound's
    clock), set by the test."""
    import rpc.dispatcher as dispatcher_module

    now = [1000.0]
    monkeypatch.setattr(dispatcher_module.time, "monotonic", lambda: now[0])
    service = FakeService()
    return service, Dispatcher(service), now


def test_a_repeated_non_public_refusal_is_logged_at_a_bounded_rate(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a full disk every write call failed with 1700 and each logged its WARNING line into that
    disk (200 submissions: 201 lines; observability probe), as did 100 posts naming a missing
    checkpoint. The same (method, code) is logged at most once per interval, with the count held
    back; another code or method is logged at once."""
    from storage.interface import StorageError

    import rpc.dispatcher as dispatcher_module

    service, dispatcher, now = _dispatcher_on_a_held_clock(monkeypatch)
    service.error = StorageError("write to '/d/db' failed: IO error: No space left on device")
    with caplog.at_level(logging.WARNING, logger="rpc.dispatcher"):
        for _ in range(200):
            dispatcher.handle(json.dumps(get_run()))
        assert len(caplog.records) == 1 and "No space left" in caplog.records[0].getMessage()
        now[0] += dispatcher_module.REFUSAL_LOG_INTERVAL_S
        dispatcher.handle(json.dumps(get_run()))
    assert len(caplog.records) == 2
    assert "199 more like it" in caplog.records[1].getMessage()


def test_a_repeated_internal_error_is_logged_with_its_traceback_at_a_bounded_rate(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A client able to trigger a bug got one ERROR traceback per request (observability probe):
    the first is logged with its traceback, the next ones are counted into the next line."""
    import rpc.dispatcher as dispatcher_module

    service, dispatcher, now = _dispatcher_on_a_held_clock(monkeypatch)
    service.error = ZeroDivisionError("a bug")
    with caplog.at_level(logging.WARNING, logger="rpc.dispatcher"):
        for _ in range(50):
            reply = json.loads(dispatcher.handle(json.dumps(get_run())))
            assert reply["error"]["code"] == -32603 and "a bug" not in json.dumps(reply)
        (record,) = caplog.records
        assert record.levelno == logging.ERROR and record.exc_info and record.exc_info[0] is ZeroDivisionError
        now[0] += dispatcher_module.REFUSAL_LOG_INTERVAL_S
        dispatcher.handle(json.dumps(get_run()))
    assert len(caplog.records) == 2 and "49 more like it" in caplog.records[1].getMessage()


def test_another_internal_error_is_logged_at_once_whatever_the_rate_of_the_first(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Review (2026-11-26): the bound was per (method, code), and every unexpected exception has
    the same code (-32603): a client repeating one harmless bug at least every 10 s kept any
    other bug of the same method from ever being logged (it was only counted as one "more like
    it"). Each exception class is its own key (bounded: the program's classes)."""
    service, dispatcher, _ = _dispatcher_on_a_held_clock(monkeypatch)
    with caplog.at_level(logging.WARNING, logger="rpc.dispatcher"):
        service.error = ZeroDivisionError("a known bug")
        for _ in range(5):
            dispatcher.handle(json.dumps(get_run()))
        service.error = KeyError("another bug")
        dispatcher.handle(json.dumps(get_run()))
    assert [r.exc_info[0] for r in caplog.records if r.exc_info] == [ZeroDivisionError, KeyError]
