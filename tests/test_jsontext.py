"""Deeply nested JSON is refused before any parser sees it (it would crash the process: see
tenzro_training/jsontext.py), everywhere untrusted JSON is parsed."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tenzro_training.errors import PayloadError, SpecError
from tenzro_training.jsontext import MAX_JSON_NESTING, compute_json_depth_bound, is_json_depth_ok
from tenzro_training.spec import TrainingTaskSpec


@pytest.mark.parametrize(
    ("text", "depth"),
    [("{}", 1), ("[[[]]]", 3), ('{"a": "[[[[["}', 1), ('["\\"[[[["]', 1), ("1", 0)],
)
def test_depth_bound_is_exact_on_wellformed_text(text: str, depth: int) -> None:
    # Below the fast-path threshold the bound is the bracket count; above it, the real depth.
    assert compute_json_depth_bound(text) >= depth
    assert is_json_depth_ok(text)


def test_depth_bound_ignores_brackets_inside_strings_on_the_slow_path() -> None:
    text = '{"k": "' + "[" * 1000 + '"}'
    assert compute_json_depth_bound(text) == 1


def test_an_unterminated_string_runs_to_the_end_of_the_text() -> None:
    """Past an unterminated string a parser reads nothing, so its brackets do not count; and
    the scan stays linear on runs of escaped quotes (a quadratic regex once cost
    TRAINING_VERIFY minutes on a 256 KiB receipt spec)."""
    prefix = b"[" * (MAX_JSON_NESTING + 2)
    assert compute_json_depth_bound(prefix + b'"' + b'\\"' * 100_000 + b"[[") == len(prefix)
    assert compute_json_depth_bound(prefix + b'"' + b'\\"' * 100_000 + b"]" * 5) == len(prefix)
    assert not is_json_depth_ok(prefix + b'"' + b'\\"' * 100_000)
    ok = b"[" * 100 + b'"' + b'\\"' * 100_000 + b"[" * 100  # 200 openers: the slow path
    assert compute_json_depth_bound(ok) == 100


@pytest.mark.parametrize(
    ("inner", "depth"),
    [
        (b'"a\\\\"', 1),  # an escaped backslash, then the closing quote
        (b'"a\\\\\\"[["', 1),  # three backslashes: the quote is escaped, the string goes on
        (b'"\\\\\\\\"[[1]]', 3),  # four: the quote closes the string
        (b'"\\n\\u005b\\\\"[1]', 2),  # other escapes hide nothing
        ('"[{\u00e9}]"'.encode(), 1),  # brackets beside multi-byte UTF-8 inside a string
    ],
)
def test_the_slow_path_reads_escapes_as_a_parser_does(inner: bytes, depth: int) -> None:
    pad = b'"' + b"[" * (MAX_JSON_NESTING + 1) + b'"'  # past the fast path, inside a string
    text = b"[" + pad + b"," + inner + b"]"
    assert compute_json_depth_bound(text) == depth


def test_the_slow_path_carries_strings_and_depth_across_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    from tenzro_training import jsontext

    monkeypatch.setattr(jsontext, "_SCAN_CHUNK", 7)
    doc = json.dumps([{"k[": ["[[[", {"\\\"[": [[["]]"]]]}]}] * 3 + ["[" * 200])
    want = compute_exact_depth(json.loads(doc))
    assert compute_json_depth_bound(doc) == want == 7


def compute_exact_depth(value: object) -> int:
    if isinstance(value, list):
        return 1 + max((compute_exact_depth(v) for v in value), default=0)
    if isinstance(value, dict):
        return 1 + max((compute_exact_depth(v) for v in value.values()), default=0)
    return 0


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(alphabet='[]{}"\\ a\u00e9\n', max_size=8),
    lambda children: st.lists(children, max_size=4)
    | st.dictionaries(st.text(alphabet='[]{}"\\ b', max_size=4), children, max_size=4),
    max_leaves=30,
)


@settings(max_examples=300, deadline=None)
@given(json_values, st.integers(min_value=0, max_value=3))
def test_on_valid_json_the_slow_path_is_the_exact_depth(value: object, wrap: int) -> None:
    """Any valid document, its strings full of brackets, quotes and backslashes, wrapped so
    that it takes the slow path: the bound is its depth exactly."""
    padding = "[" * (MAX_JSON_NESTING + 1)
    doc = [padding] * wrap + [value] if wrap else [padding, value]
    text = json.dumps(doc, ensure_ascii=False)
    assert compute_json_depth_bound(text) == compute_exact_depth(doc)
    assert compute_json_depth_bound(text.encode("utf-8")) == compute_exact_depth(doc)


def test_invalid_deep_nesting_is_refused() -> None:
    assert not is_json_depth_ok("[" * (MAX_JSON_NESTING + 1))
    assert is_json_depth_ok("[" * MAX_JSON_NESTING + "]" * MAX_JSON_NESTING)


def test_the_fast_path_counts_both_openers_together() -> None:
    """Objects and arrays nest into each other: 129 openers split 65/64 between ``[`` and
    ``{`` are one level too deep, though neither kind alone reaches the limit."""
    half = MAX_JSON_NESTING // 2
    deep = '[{"a":' * half + "["
    assert compute_json_depth_bound(deep) == MAX_JSON_NESTING + 1
    assert not is_json_depth_ok(deep)
    assert not is_json_depth_ok(deep.encode())
    at_limit = '[{"a":' * half + "1" + "}]" * half
    assert compute_json_depth_bound(at_limit) == MAX_JSON_NESTING
    assert is_json_depth_ok(at_limit)


def test_a_long_string_between_the_openers_does_not_hide_them() -> None:
    """The shape of a submission body: a few openers around a megabyte-long base64 string."""
    filler = '"' + "A" * (1 << 20) + '"'
    deep = ("[" + filler + ",") * (MAX_JSON_NESTING + 1)
    assert not is_json_depth_ok(deep)
    shallow = '{"params":{"payload":' + filler + "}}"
    assert compute_json_depth_bound(shallow) == 2
    assert is_json_depth_ok(shallow)


def test_invalid_spec_deep_nesting_raises_spec_error_not_crash() -> None:
    with pytest.raises(SpecError):
        TrainingTaskSpec.from_json("[" * 200_000)


def test_invalid_payload_header_deep_nesting_raises_payload_error() -> None:
    import struct

    import torch

    from tenzro_training.fragments import compute_fragment_layouts
    from tenzro_training.payload import decode_payload

    layout = compute_fragment_layouts({"w": torch.zeros(4)}, 1)[0]
    header = b"{" + b'"a":[' * 5000
    data = struct.pack("<Q", len(header)) + header
    with pytest.raises(PayloadError):
        decode_payload(data, layout, max_bytes=1 << 20)


def test_depth_bound_of_text_whose_brackets_are_all_inside_strings_is_zero() -> None:
    text = '"' + "[" * (MAX_JSON_NESTING + 100) + '"'  # slow path: every bracket is string content
    assert compute_json_depth_bound(text) == 0
    assert compute_json_depth_bound(text.encode()) == 0
    assert is_json_depth_ok(text)


def test_values_bound_counts_the_first_value_too() -> None:
    from tenzro_training.jsontext import compute_json_values_bound

    assert compute_json_values_bound("1") == 1
    assert compute_json_values_bound(b"[1,2]") == 3  # the array and its two elements
    assert compute_json_values_bound('{"a":[]}') == 4  # object, key, value, array: an over-estimate by one


def test_loads_bounded_parses_plain_json() -> None:
    from tenzro_training.jsontext import loads_bounded

    assert loads_bounded('{"a": [1, 2.5, null, "x"]}') == {"a": [1, 2.5, None, "x"]}
    assert loads_bounded(b'{"a": 1, "b": 2}', unique_keys=True) == {"a": 1, "b": 2}
    assert loads_bounded('{"a": 1, "a": 2}') == {"a": 2}  # json.loads' rule unless unique_keys


@pytest.mark.parametrize("text", ["NaN", "[1, Infinity]", '{"a": -Infinity}'])
def test_invalid_loads_bounded_non_json_constants(text: str) -> None:
    from tenzro_training.jsontext import loads_bounded

    with pytest.raises(ValueError, match="is not JSON"):
        loads_bounded(text)


def test_invalid_loads_bounded_duplicate_key_with_unique_keys() -> None:
    from tenzro_training.jsontext import loads_bounded

    with pytest.raises(ValueError, match="duplicate key 'a'"):
        loads_bounded('{"a": 1, "b": {"a": 2}, "a": 3}', unique_keys=True)
    with pytest.raises(ValueError, match="duplicate key 'k'"):
        loads_bounded('[{"k": 1, "k": 1}]', unique_keys=True)


def test_invalid_loads_bounded_nesting_deeper_than_the_limit() -> None:
    from tenzro_training.jsontext import loads_bounded

    ok = "[" * MAX_JSON_NESTING + "]" * MAX_JSON_NESTING
    assert loads_bounded(ok) is not None
    too_deep = "[" * (MAX_JSON_NESTING + 1) + "]" * (MAX_JSON_NESTING + 1)  # json.loads alone would parse it
    with pytest.raises(ValueError, match="nested deeper"):
        loads_bounded(too_deep)


@pytest.mark.parametrize("encoding", ["utf-16-le", "utf-16-be", "utf-16", "utf-32-le", "utf-32-be", "utf-32"])
def test_bytes_json_loads_reads_as_utf16_or_utf32_are_bounded_as_it_reads_them(encoding: str) -> None:
    """``json.loads`` of bytes also reads UTF-16 and UTF-32. U+2241 is the bytes ``41 22`` in
    UTF-16-LE: scanned as UTF-8 it opened a "string" that hid the brackets after it (bound 1
    for a depth of 5001)."""
    import json

    deep = '["\u2241",' + "[" * 5000 + "]" * 5000 + "]"
    data = deep.encode(encoding)
    assert json.detect_encoding(data).replace("-sig", "").startswith(encoding[:6])
    assert compute_json_depth_bound(data) == 5001
    assert not is_json_depth_ok(data)
    shallow = '["\u2241", [1, {"a": "[[[["}]]'
    assert compute_json_depth_bound(shallow.encode(encoding)) == compute_json_depth_bound(shallow)


def test_a_node_reply_nested_deep_in_utf16_is_refused_not_a_crash() -> None:
    """The CLI reads a node's reply, untrusted, with json.loads of the bytes; run in a child,
    since before the fix this reply killed the process with SIGSEGV (eth-account imported)."""
    import subprocess
    import sys

    child = (
        "import eth_account, sys\n"
        "from tenzro_training.cli import CliError, RpcClient\n"
        "raw = ('[\"\\u2241\",' + '[' * 200000 + ']' * 200000 + ']').encode('utf-16-le')\n"
        "try:\n"
        "    RpcClient('http://127.0.0.1:1')._read_reply(raw, 1)\n"
        "except CliError as exc:\n"
        "    print('refused:', exc)\n"
    )
    done = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    assert "answered JSON nested deeper than 128" in done.stdout


def test_the_cli_counts_a_replys_values_before_it_scans_its_depth() -> None:
    """Counting is the cheaper scan: a reply over both limits is refused on its values."""
    from tenzro_training.cli.client import MAX_REPLY_VALUES, RpcClient
    from tenzro_training.cli.exits import CliError

    raw = b"[" * (MAX_JSON_NESTING + 1) + b"0," * MAX_REPLY_VALUES
    with pytest.raises(CliError, match=f"more than {MAX_REPLY_VALUES} JSON values"):
        RpcClient("http://127.0.0.1:1")._read_reply(raw, 1)


def test_the_slow_path_needs_memory_for_one_chunk_not_for_every_string() -> None:
    """A 64 MiB body of ``""`` pairs (~100 KB gzipped) cost a node 3.7 GiB in the slow path: one
    object per deleted string, int64 per bracket. Now the scan holds one chunk's scratch (and
    the text less its escapes). Measured here on 8 MiB with tracemalloc, which sees numpy's
    buffers too: a memory bound, deterministic, not a timing."""
    import tracemalloc

    data = b"[" * (MAX_JSON_NESTING + 2) + b'""ab' * (2 << 20)
    tracemalloc.start()
    try:
        assert compute_json_depth_bound(data) == MAX_JSON_NESTING + 2
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 32 << 20, peak
