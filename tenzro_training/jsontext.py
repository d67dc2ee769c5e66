"""Bounds on untrusted JSON text, checked before any parser sees it.

Why this exists: py_ecc (imported by eth-account) raises the interpreter's recursion limit to
100000 for the whole process, after which ``json.loads`` on ~60000 nested brackets overflows the
C stack and kills the process instead of raising. Every parse of untrusted JSON in the project
(spec files, payload headers, JSON-RPC bodies, gossip) therefore checks nesting depth here first.

This module is part of the pure core. Its one parsing entry point, :func:`loads_bounded`, is
``json.loads`` behind the depth check, for readers that need nothing more; its one writer,
:func:`serialize_json`, is the compact form the node's JSON answers take.
"""

from __future__ import annotations

import json
from typing import Final

import numpy as np

MAX_JSON_NESTING: Final = 128
"""Deepest array/object nesting any project parser accepts (specs need ~5, RPC bodies ~8)."""

_SCAN_CHUNK: Final = 1 << 20
"""Bytes per step of the slow path's scan: its scratch is ~14 bytes per byte of one chunk."""


def compute_json_depth_bound(raw: bytes | str) -> int:
    """An upper bound on the array/object nesting depth a JSON parser would reach on ``raw``.

    Brackets inside strings do not count; the running depth of the others is computed with
    numpy, a chunk at a time. On malformed input this can only over-estimate the depth the
    parser would reach before failing, so a check against it never lets a too-deep document
    through.
    """
    data = _utf8_as_parsed(raw)
    # Fast path: a document cannot nest deeper than its number of opening brackets, found one
    # at a time with ``bytes.find`` (memchr: ~0.03 ms for the 1.4 MB body of a 1 MiB base64
    # payload, whose one long string holds none) and given up past MAX_JSON_NESTING. Measured
    # against it on this 2-core machine, per such body: 0.41-0.63 ms deleting every other byte
    # (``translate``), ~0.7 ms for two ``bytes.count`` passes, ~1.2 ms for a numpy compare.
    openers = _count_openers(data, MAX_JSON_NESTING + 1)
    if openers <= MAX_JSON_NESTING:
        return openers
    return _scan_depth(data)


def _scan_depth(data: bytes) -> int:
    """The running bracket depth's maximum, brackets inside strings left out, in memory that
    does not grow with the input: one chunk's scratch (:data:`_SCAN_CHUNK`) and the text less
    its escaped backslashes and quotes.

    Escapes go first. A run of backslashes pairs up from its start (in a string the first of a
    run always begins an escape), so deleting every ``\\\\`` pair, then every ``\\"`` pair,
    leaves exactly the quotes that open or close strings. A byte is then inside a string when
    an odd number of quotes come before it; an unterminated string runs to the end, as a parser
    reads nothing after it. Outside a string a backslash stops any parser, so what the deletion
    changes after one is never reached.

    Why not a regex that deletes the strings (until 2026-11-26): ``re.sub`` builds one object
    per string and numpy then took 16 bytes per bracket, so a 64 MiB body of ``""`` pairs and
    brackets, which gzip sends in ~100 KB, cost a node 3.7 GiB and 5 s before it was refused
    (fuzzing probe). UTF-8 multi-byte sequences hold no quote, backslash or bracket byte.
    """
    text = data.replace(b"\\\\", b"").replace(b'\\"', b"")
    depth = peak = 0
    inside = 0  # 1 while the chunk boundary falls inside a string
    for start in range(0, len(text), _SCAN_CHUNK):
        codes = np.frombuffer(text, dtype=np.uint8, count=min(_SCAN_CHUNK, len(text) - start), offset=start)
        quotes = codes == 0x22
        outside = (np.cumsum(quotes, dtype=np.int32) + inside) % 2 == 0  # a quote is neither: no bracket
        steps = (((codes == 0x5B) | (codes == 0x7B)) & outside).astype(np.int64)
        steps -= ((codes == 0x5D) | (codes == 0x7D)) & outside
        running = np.cumsum(steps, out=steps)
        peak = max(peak, depth + int(running.max()))
        depth += int(running[-1])
        inside = (inside + int(np.count_nonzero(quotes))) % 2
    return max(0, peak)


def _utf8_as_parsed(raw: bytes | str) -> bytes:
    """``raw`` as UTF-8 bytes of the text ``json.loads(raw)`` would parse.

    ``json.loads`` of bytes also reads UTF-16 and UTF-32, which it recognises by their zero
    bytes (``json.detect_encoding``). The bound scans UTF-8 bytes for quotes and brackets, so
    such bytes are first decoded as ``json.loads`` decodes them: bounded as they were, a
    character like U+2241 (bytes ``41 22`` in UTF-16-LE) read as a quote, hid the brackets
    after it, and a 200,000-deep UTF-16 reply from a node got past the bound and crashed the
    CLI (SIGSEGV: eth-account's py_ecc raises the recursion limit; review, 2026-11-26).
    UTF-8 input, what every caller is sent, is scanned as it is.
    """
    if isinstance(raw, str):
        return raw.encode("utf-8", "surrogatepass")
    data = bytes(raw)
    encoding = json.detect_encoding(data)
    if encoding in ("utf-8", "utf-8-sig"):  # the BOM holds no quote or bracket
        return data
    try:
        return data.decode(encoding, "surrogatepass").encode("utf-8", "surrogatepass")
    except UnicodeDecodeError:
        return data  # json.loads cannot decode it either: it parses nothing


def _count_openers(data: bytes, stop: int) -> int:
    """How many ``[`` and ``{`` bytes ``data`` holds, counting no further than ``stop``."""
    count = 0
    for opener in (b"[", b"{"):
        at = data.find(opener)
        while at != -1:
            count += 1
            if count >= stop:
                return count
            at = data.find(opener, at + 1)
    return count


def compute_json_values_bound(raw: bytes | str) -> int:
    """An upper bound on the number of values (and object keys) a JSON parser would build from
    ``raw``: every one but the first follows a ``,``, ``:``, ``[`` or ``{`` (counted inside
    strings too, which only over-estimates). Why: parsed objects cost 50-100x the bytes of
    ``{}`` or ``0,`` in memory, so a byte cap alone does not bound a parse."""
    data = _utf8_as_parsed(raw)
    return 1 + sum(data.count(c) for c in (b",", b":", b"[", b"{"))


def is_json_depth_ok(raw: bytes | str, limit: int = MAX_JSON_NESTING) -> bool:
    """True when ``raw`` cannot nest deeper than ``limit``."""
    return compute_json_depth_bound(raw) <= limit


def serialize_json(obj: object) -> bytes:
    """Compact ASCII JSON, the form every JSON answer of the node takes; raises
    TypeError/ValueError for non-JSON values (bytes, NaN, ...)."""
    return json.dumps(obj, separators=(",", ":"), allow_nan=False).encode("ascii")


def refuse_json_constant(name: str) -> None:
    """``json.loads(..., parse_constant=refuse_json_constant)``: NaN, Infinity and -Infinity are
    Python's extensions, not JSON; raises ValueError (what json.loads raises for bad text)."""
    raise ValueError(f"{name} is not JSON")


def unique_keys_object(pairs: list[tuple[str, object]]) -> dict[str, object]:
    """``json.loads(..., object_pairs_hook=unique_keys_object)``: a key given twice is a
    ValueError. json.loads keeps the last one silently: which one did the author mean?"""
    obj: dict[str, object] = {}
    for key, value in pairs:
        if key in obj:
            raise ValueError(f"duplicate key {key[:100]!r}")
        obj[key] = value
    return obj


def loads_bounded(text: str | bytes, *, unique_keys: bool = False) -> object:
    """``json.loads`` of untrusted text, depth-checked first and without NaN/Infinity (and,
    with ``unique_keys``, without a key given twice in one object).

    Raises ValueError (as json.loads does) for malformed, too deeply nested or non-JSON text.
    """
    if not is_json_depth_ok(text):
        raise ValueError(f"JSON nested deeper than {MAX_JSON_NESTING}")
    return json.loads(text, parse_constant=refuse_json_constant,
                      object_pairs_hook=unique_keys_object if unique_keys else None)
