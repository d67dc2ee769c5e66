"""logformat.py: the JSON log format is one parseable object per record, whatever the record
holds (a traceback, hostile text, a run event with an amount above 2^53)."""

from __future__ import annotations

import io
import json
import logging
import re
import sys

import pytest

from tenzro_training.logformat import RUN_EVENT_ATTR, JsonFormatter, configure_logging
from tenzro_training.run_events import RunSealed, TrainerEnrolled


def _record(msg: str, *args: object, exc_info: object = None, extra: dict[str, object] | None = None) -> logging.LogRecord:
    logger = logging.getLogger("tenzro.test")
    return logger.makeRecord("tenzro.test", logging.WARNING, __file__, 1, msg, args, exc_info, extra=extra)  # type: ignore[arg-type]


def test_a_record_is_one_json_line_with_rfc3339_utc_time() -> None:
    record = _record("quorum %s of %d", "reached", 3)
    record.created = 1764115200.9999  # 2025-11-26T00:00:00.9999Z: milliseconds truncate, never 1000
    line = JsonFormatter().format(record)
    assert "\n" not in line
    assert json.loads(line) == {
        "time": "2025-11-26T00:00:00.999Z", "level": "WARNING", "logger": "tenzro.test", "message": "quorum reached of 3",
    }


def test_a_traceback_and_hostile_text_stay_inside_the_record() -> None:
    try:
        raise ValueError("bad\nline")
    except ValueError:
        import sys

        record = _record("did: %s", "evil\n2026-01-01 INFO forged line \u202e\udcff", exc_info=sys.exc_info())
    line = JsonFormatter().format(record)
    assert "\n" not in line and line.isascii()  # a lone surrogate or RTL override is escaped, not raised
    doc = json.loads(line)
    assert doc["message"] == "did: evil\n2026-01-01 INFO forged line \u202e\udcff"
    assert doc["exception"].startswith("Traceback (most recent call last):") and "ValueError: bad\nline" in doc["exception"]


def test_a_run_event_is_carried_as_its_json_form() -> None:
    trainer = bytes.fromhex("52908400098527886e0f7030069857d2e4169ee7")
    sealed = RunSealed("t-1", 7, b"\x01" * 32, b"\x02" * 32, ((trainer, 2**70 + 1),), 3)
    line = JsonFormatter().format(_record("RunSealed ...", extra={RUN_EVENT_ATTR: sealed}))
    event = json.loads(line)["event"]
    assert event == sealed.to_dict()
    assert event["type"] == "RunSealed" and event["payouts"] == [["0x52908400098527886E0F7030069857D2E4169EE7", str(2**70 + 1)]]


def test_the_node_logs_each_run_event_with_its_fields(caplog: pytest.LogCaptureFixture) -> None:
    from tenzro_training.node.main import _log_event

    event = TrainerEnrolled("t-1", 5, b"\x11" * 20, "did:tenzro:a", 10**18, 2)
    with caplog.at_level(logging.INFO, logger="tenzro.node"):
        _log_event(event)
    [record] = [r for r in caplog.records if r.name == "tenzro.node"]
    assert record.getMessage().startswith("TrainerEnrolled task_id=t-1 at_ms=5 ")  # the text format is unchanged
    assert json.loads(JsonFormatter().format(record))["event"] == {
        "type": "TrainerEnrolled", "task_id": "t-1", "at_ms": 5, "trainer": "0x" + "11" * 20, "did": "did:tenzro:a",
        "stake": str(10**18), "shard_index": 2,
    }


def test_configure_logging_formats_and_refusals(monkeypatch: pytest.MonkeyPatch) -> None:
    root = logging.getLogger()
    monkeypatch.setattr(root, "handlers", [])  # pytest's own handlers would make basicConfig a no-op
    monkeypatch.setattr(root, "level", root.level)
    out = io.StringIO()
    configure_logging("warning", "json", stream=out)
    logging.getLogger("tenzro.node").info("not shown")
    logging.getLogger("tenzro.node").warning("shown")
    [line] = out.getvalue().splitlines()
    assert json.loads(line)["message"] == "shown"
    root.handlers = []
    text = io.StringIO()
    configure_logging("INFO", stream=text)
    logging.getLogger("tenzro.node").info("plain")
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} INFO tenzro.node: plain\n", text.getvalue())
    with pytest.raises(ValueError, match="log format must be one of text, json"):
        configure_logging("INFO", "logfmt")
    with pytest.raises(ValueError, match="log level must be one of"):
        configure_logging("VERBOSE")


def test_the_final_stderr_line_follows_the_log_format(monkeypatch: pytest.MonkeyPatch) -> None:
    """Under ``--log-format json`` the CLI's exit line (``tenzro: the node stopped with a storage
    error ...``) and the trainer's ``trainer stopped`` were plain text among JSON records: a
    collector splitting on newlines got a record that is not JSON (observability probe)."""
    from tenzro_training import cli, logformat

    root = logging.getLogger()
    monkeypatch.setattr(root, "handlers", [])
    monkeypatch.setattr(root, "level", root.level)
    monkeypatch.setattr(logformat, "_configured_format", None)
    assert logformat.format_stderr_line("tenzro: x") == "tenzro: x"  # nothing configured: as is
    configure_logging("CRITICAL", "json", stream=io.StringIO())
    record = json.loads(logformat.format_stderr_line("tenzro: disk full \u2028"))
    assert (record["level"], record["logger"], record["message"]) == ("ERROR", "tenzro", "tenzro: disk full \u2028")
    err = io.StringIO()
    monkeypatch.setattr(sys, "stderr", err)
    assert cli.main(["train", "get-run", "--task-id", "t", "--rpc", "http://127.0.0.1:1"]) != 0
    [line] = err.getvalue().splitlines()
    assert json.loads(line)["message"].startswith("tenzro: ")


def test_run_events_an_operator_must_act_on_are_warnings(caplog: pytest.LogCaptureFixture) -> None:
    """A slash, an equivocation, a failover, a lost quorum and a failed run were INFO like every
    enrollment: a node run at ``--log-level WARNING`` (or alerting on WARNING) never showed them
    (observability probe). The routine events stay INFO."""
    from tenzro_training.node.main import _log_event
    from tenzro_training.run_events import QuorumLost, RunFailed, SyncerFailover, TrainerSlashed

    events = [
        TrainerSlashed("t", 1, b"\x11" * 20, 10**18), RunFailed("t", 2, "only 1 unslashed trainer(s) left"),
        SyncerFailover("t", 3, 0, b"\x11" * 20, 1, b"\x22" * 20, 2, 9), QuorumLost("t", 4, 0),
        TrainerEnrolled("t", 5, b"\x11" * 20, "did:tenzro:a", 10**18, 2),
    ]
    with caplog.at_level(logging.INFO, logger="tenzro.node"):
        for event in events:
            _log_event(event)
    levels = [r.levelno for r in caplog.records if r.name == "tenzro.node"]
    assert levels == [logging.WARNING] * 4 + [logging.INFO]


def test_the_key_file_warning_follows_the_log_format(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Review (2026-11-26): under ``TENZRO_LOG_FORMAT=json`` the trainer reads its key file after
    configuring the log, and a group-readable key file's warning was a plain text line among the
    JSON records, although docs/cli.md says every stderr line is JSON."""
    import os

    from tenzro_training import logformat
    from tenzro_training.cli import keys as cli_keys

    root = logging.getLogger()
    monkeypatch.setattr(root, "handlers", [])
    monkeypatch.setattr(root, "level", root.level)
    monkeypatch.setattr(logformat, "_configured_format", None)
    configure_logging("INFO", "json", stream=io.StringIO())
    key = tmp_path / "key"
    key.write_text("11" * 32)
    os.chmod(key, 0o644)
    err = io.StringIO()
    monkeypatch.setattr(sys, "stderr", err)
    cli_keys.load_private_key(str(key))
    [line] = err.getvalue().splitlines()
    record = json.loads(line)
    assert record["level"] == "WARNING" and "allows group/other access" in record["message"]


class _Opaque:
    """Not JSON-serialisable (a Path or a bytes value an event might carry by mistake)."""

    def __str__(self) -> str:
        return "opaque"


class _EventWithOpaqueField:
    def to_dict(self) -> dict[str, object]:
        return {"type": "Odd", "where": _Opaque()}


def test_a_field_json_cannot_encode_is_written_as_text_not_a_logging_error() -> None:
    """An event field json cannot encode must still give one record: a formatter that raised
    makes ``logging`` print its own multi-line "--- Logging error ---" traceback to stderr,
    which a collector splitting on newlines gets as several non-JSON records."""
    line = JsonFormatter().format(_record("odd", extra={RUN_EVENT_ATTR: _EventWithOpaqueField()}))
    assert json.loads(line)["event"] == {"type": "Odd", "where": "opaque"}


def test_a_stack_record_carries_its_stack_in_the_record() -> None:
    """``log.warning(..., stack_info=True)`` is how the node says where a surprise came from; the
    stack must be a field of its one-line record, not lost."""
    record = logging.getLogger("tenzro.test").makeRecord(
        "tenzro.test", logging.WARNING, __file__, 1, "here", (), None, sinfo="Stack (most recent call last):\n  f()")
    doc = json.loads(JsonFormatter().format(record))
    assert doc["stack"] == "Stack (most recent call last):\n  f()"


def test_the_time_is_utc_with_three_millisecond_digits_whatever_the_local_zone(monkeypatch: pytest.MonkeyPatch) -> None:
    """Collectors parse ``time`` as RFC 3339 without a format string: it must be UTC (``Z``) on a
    host whose local zone is not, and milliseconds below 100 keep their leading zeros (``.005``,
    not ``.5``, which reads as 500 ms)."""
    import time

    monkeypatch.setenv("TZ", "EST+05")
    time.tzset()
    try:
        record = _record("x")
        record.created = 1764115200.0051  # 2025-11-26T00:00:00.005Z
        assert json.loads(JsonFormatter().format(record))["time"] == "2025-11-26T00:00:00.005Z"
    finally:
        monkeypatch.undo()
        time.tzset()


@pytest.mark.parametrize("level", ["debug", "INFO", "Warning", "error", "CRITICAL"])
def test_configure_logging_accepts_every_level_in_any_case(level: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """``--log-level debug`` is what an operator asks for while chasing a problem; each of the
    documented levels, in any case, must be accepted and must set the root level."""
    root = logging.getLogger()
    monkeypatch.setattr(root, "handlers", [])
    monkeypatch.setattr(root, "level", root.level)
    configure_logging(level, stream=io.StringIO())
    assert root.level == logging.getLevelName(level.upper())


def test_an_embedding_programs_handlers_keep_their_format_for_the_stderr_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """A program embedding the CLI (or pytest) keeps its own handlers and their text format;
    the final ``tenzro: ...`` line must then stay text too, not turn into a JSON record among
    the program's text lines."""
    from tenzro_training import logformat

    root = logging.getLogger()
    mine = logging.StreamHandler(io.StringIO())
    monkeypatch.setattr(root, "handlers", [mine])
    monkeypatch.setattr(logformat, "_configured_format", None)
    configure_logging("INFO", "json", stream=io.StringIO())
    assert root.handlers == [mine]
    assert logformat.format_stderr_line("tenzro: x") == "tenzro: x"
