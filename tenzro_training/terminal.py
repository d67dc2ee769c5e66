"""Text a node sent us, made safe to print on a terminal or a log line.

Why: the CLI, the syncer daemon and the trainer print what a node answers (error messages, task
ids, statuses). A hostile or broken node could otherwise write terminal escape sequences
(retitle the window, clear the screen, fake earlier output), bidirectional overrides that
reorder what the reader sees, a lone surrogate that ``print`` cannot encode (which ended the
syncer daemon), or a 50 MB "line". Every string from a node goes through :func:`printable`
before it is printed; ``--json`` output is already ASCII-escaped by ``json.dumps``.
"""

from __future__ import annotations

__all__ = ["MAX_LINE_CHARS", "printable", "printable_lines"]

MAX_LINE_CHARS = 2000
"""Characters of one printed line kept; the rest is replaced by a count."""


def printable(text: str, limit: int = MAX_LINE_CHARS) -> str:
    """``text`` with every character that is not printable (controls, format characters such
    as bidi overrides, surrogates, unassigned code points, line breaks) written as its Python
    escape (``\\x1b``, ``\\u202e``), cut to ``limit`` characters with a note of how many more
    there were. Printable text, non-ASCII letters included, is unchanged."""
    text = str(text)
    cut = text[:limit]
    if not cut.isprintable():
        cut = "".join(ch if ch.isprintable() else ascii(ch)[1:-1] for ch in cut)
    if len(text) > limit:
        cut += f"... ({len(text) - limit} more characters)"
    return cut


def printable_lines(text: str, limit: int = MAX_LINE_CHARS) -> str:
    """:func:`printable` line by line: the line breaks of a multi-line human format stay."""
    return "\n".join(printable(line, limit) for line in str(text).split("\n"))
