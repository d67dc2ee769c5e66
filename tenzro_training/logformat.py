"""How the node and trainer processes write their logs to stderr: the human line, or one JSON
object per line.

Why JSON: operators ship node logs to a collector (journald, Loki, an ELK stack) that splits on
newlines. A multi-line traceback in the text format becomes several unrelated records there, and a
run event is a line of ``key=value`` text to be parsed back. In the JSON format every record is
exactly one line (a traceback is a field of its record) and a run event carries its
:meth:`~tenzro_training.run_events.RunEvent.to_dict` form, whose amounts above 2^53 are decimal
strings so that no reader rounds them.

What this module is NOT: where log records come from (each module's ``logging.getLogger``), or the
trainer's and syncer's stdout progress lines, which are the process's output, not its log.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import IO, Any, Final

__all__ = ["LOG_FORMATS", "LOG_LEVELS", "RUN_EVENT_ATTR", "JsonFormatter", "configure_logging", "format_stderr_line"]

LOG_FORMATS: Final = ("text", "json")
LOG_LEVELS: Final = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")

TEXT_FORMAT: Final = "%(asctime)s %(levelname)s %(name)s: %(message)s"

RUN_EVENT_ATTR: Final = "run_event"
"""The ``extra=`` key under which a record carries a run event (any object with ``to_dict()``):
``log.info("%s", line, extra={RUN_EVENT_ATTR: event})``. The text format ignores it."""


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line:
    ``{"time", "level", "logger", "message"[, "event"][, "exception"][, "stack"]}``.

    ``time`` is UTC, RFC 3339 with milliseconds (collectors parse it without a format string);
    non-ASCII is escaped, so a hostile string in a message cannot break the line or its encoding.
    """

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": _rfc3339_utc(record.created),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        event = getattr(record, RUN_EVENT_ATTR, None)
        if event is not None:
            out["event"] = event.to_dict()
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        if record.stack_info:
            out["stack"] = self.formatStack(record.stack_info)
        return json.dumps(out, ensure_ascii=True, separators=(",", ":"), default=str)


def _rfc3339_utc(created: float) -> str:
    seconds = int(created)
    millis = min(999, int((created - seconds) * 1000))
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{millis:03d}Z"


def configure_logging(level: str, fmt: str = "text", *, stream: IO[str] | None = None) -> None:
    """Send every log record at ``level`` and above to ``stream`` (stderr) in ``fmt``
    (:data:`LOG_FORMATS`). Like :func:`logging.basicConfig`, it does nothing when the root logger
    has handlers already: a program embedding the CLI (or pytest) keeps its own."""
    if fmt not in LOG_FORMATS:
        raise ValueError(f"log format must be one of {', '.join(LOG_FORMATS)}, got {fmt!r}")
    if level.upper() not in LOG_LEVELS:
        raise ValueError(f"log level must be one of {', '.join(LOG_LEVELS)}, got {level!r}")
    global _configured_format
    if logging.getLogger().handlers:
        return  # as basicConfig: the embedding program's handlers (and format) stay
    handler = logging.StreamHandler(sys.stderr if stream is None else stream)
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT))
    logging.basicConfig(level=level.upper(), handlers=[handler])
    _configured_format = fmt


_configured_format: str | None = None
"""The format :func:`configure_logging` installed in this process (None: it installed none)."""


def format_stderr_line(text: str, level: int = logging.ERROR) -> str:
    """A line the process writes to stderr outside its log (the CLI's final ``tenzro: ...`` error,
    the trainer's ``trainer stopped``), in the log's format: under ``json`` one JSON record like
    every other line (logger ``tenzro``), so a collector splitting on newlines never gets a line
    that is not JSON (observability probe: the exit line of a node stopped by a full disk was
    plain text among JSON); else ``text`` unchanged. Written whatever the log level."""
    if _configured_format != "json":
        return text
    return JsonFormatter().format(logging.LogRecord("tenzro", level, "", 0, text, None, None))
