"""Init checkpoint loading: file:// only, confinement to allowed directories, size cap, exact
SHA-256 of the bytes read, safetensors only, float dtypes widened to fp32."""

from __future__ import annotations

import hashlib
import os
from concurrent.futures import ThreadPoolExecutor, TimeoutError
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
import safetensors.torch
import torch

from tenzro_training.errors import CheckpointError, SpecError
from tenzro_training.node.checkpoint import load_init_checkpoint, resolve_checkpoint_path
from tenzro_training.spec import TrainingTaskSpec

from tests.node.conftest import initial_state, spec_dict, write_checkpoint


def spec_for(uri: str, sha: str) -> TrainingTaskSpec:
    return TrainingTaskSpec.from_dict(spec_dict(uri, sha))


def test_loads_and_verifies(tmp_path: Path) -> None:
    uri, sha = write_checkpoint(tmp_path)
    state = load_init_checkpoint(spec_for(uri, sha), allowed_dirs=(tmp_path,), max_bytes=1 << 20)
    expected = initial_state()
    assert state.keys() == expected.keys()
    assert all(torch.equal(state[k], expected[k]) and state[k].dtype == torch.float32 for k in expected)


def test_bf16_checkpoint_is_widened_exactly(tmp_path: Path) -> None:
    bf = {k: v.to(torch.bfloat16) for k, v in initial_state().items()}
    uri, sha = write_checkpoint(tmp_path, bf)
    state = load_init_checkpoint(spec_for(uri, sha), max_bytes=1 << 20)
    assert all(state[k].dtype == torch.float32 and torch.equal(state[k], bf[k].float()) for k in bf)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_invalid_non_finite_weights(tmp_path: Path, bad: float, dtype: torch.dtype) -> None:
    """A NaN initial model was accepted: every trainer diverges at its first step and the run
    fails only at its deadlines."""
    state = {k: v.to(dtype) for k, v in initial_state().items()}
    name = sorted(state)[-1]
    state[name] = state[name].clone().flatten()
    state[name][0] = bad
    uri, sha = write_checkpoint(tmp_path, state)
    with pytest.raises(CheckpointError) as info:
        load_init_checkpoint(spec_for(uri, sha), max_bytes=1 << 20)
    assert f"tensor {name!r} holds NaN or infinite values" in info.value.reason


def test_invalid_hash_mismatch(tmp_path: Path) -> None:
    uri, _ = write_checkpoint(tmp_path)
    with pytest.raises(CheckpointError) as info:
        load_init_checkpoint(spec_for(uri, "0x" + "11" * 32), max_bytes=1 << 20)
    assert "sha256" in info.value.reason


def test_invalid_missing_init_checkpoint(tmp_path: Path) -> None:
    doc = spec_dict("file:///x", "0x" + "00" * 32)
    doc["architecture"]["metadata"] = {}
    with pytest.raises(SpecError):
        load_init_checkpoint(TrainingTaskSpec.from_dict(doc), max_bytes=1 << 20)


def test_invalid_size_cap(tmp_path: Path) -> None:
    uri, sha = write_checkpoint(tmp_path)
    with pytest.raises(CheckpointError) as info:
        load_init_checkpoint(spec_for(uri, sha), max_bytes=64)
    assert "limit" in info.value.reason


@pytest.mark.parametrize(
    "uri",
    ["http://example.com/x.safetensors", "file://remote-host/x.safetensors", "file:relative/x", "s3://b/k",
     "file:///tmp/x?y=1", "file:///tmp/x#frag",
     # urlsplit raises ValueError("Invalid IPv6 URL") on an unbalanced bracket in the host part;
     # the spec's URI grammar admits the brackets (fuzzing postTask found it answered -32603).
     "file://[x/init.safetensors", "file://[::1/x", "file://a]b/x"],
)
def test_invalid_uri_forms(uri: str) -> None:
    with pytest.raises(CheckpointError):
        resolve_checkpoint_path(uri, ())


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(["file://", "file:///", "FILE://", "file:", "file://localhost/", "http://"]),
       st.text(alphabet="[]@:/%?#.0a-_", max_size=24))
def test_any_spec_uri_resolves_or_is_a_checkpoint_error(prefix: str, rest: str) -> None:
    """Every URI the spec's grammar admits (printable ASCII) either resolves or is refused with
    a CheckpointError: nothing else may reach postTask's caller (an unbalanced IPv6 bracket
    made urlsplit raise ValueError, answered -32603)."""
    try:
        resolve_checkpoint_path(prefix + rest, (Path("/nonexistent-allowed-dir"),))
    except CheckpointError:
        pass


def test_invalid_outside_allowed_dirs_even_through_a_symlink(tmp_path: Path) -> None:
    allowed = tmp_path / "allowed"
    elsewhere = tmp_path / "elsewhere"
    uri, sha = write_checkpoint(elsewhere)
    with pytest.raises(CheckpointError):
        load_init_checkpoint(spec_for(uri, sha), allowed_dirs=(allowed,), max_bytes=1 << 20)
    allowed.mkdir()
    link = allowed / "link.safetensors"
    os.symlink(elsewhere / "init.safetensors", link)
    with pytest.raises(CheckpointError):
        load_init_checkpoint(spec_for(link.as_uri(), sha), allowed_dirs=(allowed,), max_bytes=1 << 20)
    # "allowed2" starts with "allowed" but is not inside it.
    sibling = tmp_path / "allowed2"
    uri2, sha2 = write_checkpoint(sibling)
    with pytest.raises(CheckpointError):
        load_init_checkpoint(spec_for(uri2, sha2), allowed_dirs=(allowed,), max_bytes=1 << 20)
    assert resolve_checkpoint_path((allowed / "a" / ".." / "b").as_uri(), (allowed,)) == allowed.resolve() / "b"


def test_invalid_directory_and_missing_file(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError):
        load_init_checkpoint(spec_for(tmp_path.as_uri(), "0x" + "00" * 32), max_bytes=1 << 20)
    with pytest.raises(CheckpointError):
        load_init_checkpoint(spec_for((tmp_path / "none").as_uri(), "0x" + "00" * 32), max_bytes=1 << 20)


def test_invalid_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    """A FIFO named as the checkpoint: opening it for reading would block until a writer comes,
    on the node's one service thread (every RPC call would hang). It is refused at once."""
    fifo = tmp_path / "init.safetensors"
    os.mkfifo(fifo)
    spec = spec_for(fifo.as_uri(), "0x" + "00" * 32)
    with ThreadPoolExecutor(max_workers=1) as pool:
        future = pool.submit(load_init_checkpoint, spec, max_bytes=1 << 20)
        try:
            error = future.exception(timeout=30)  # a hang guard, not a timing assertion
        except TimeoutError:
            with open(fifo, "wb"):  # release the blocked open so the worker can end
                pass
            pytest.fail("opening the FIFO blocked")
    assert isinstance(error, CheckpointError) and "not a regular file" in str(error)


@pytest.mark.parametrize(
    "data",
    [
        b"not a safetensors file at all",
        safetensors.torch.save({"a": torch.zeros(2, dtype=torch.int64)}),
        safetensors.torch.save({"a": torch.zeros(2, dtype=torch.float64)}),
        safetensors.torch.save({"a#1": torch.zeros(2)}),
        safetensors.torch.save({}),
        safetensors.torch.save({"a": torch.zeros([1] * 65)}),  # torch.isfinite raised a bare RuntimeError
    ],
)
def test_invalid_contents(tmp_path: Path, data: bytes) -> None:
    path = tmp_path / "bad.safetensors"
    path.write_bytes(data)
    sha = "0x" + hashlib.sha256(data).hexdigest()
    with pytest.raises(CheckpointError):
        load_init_checkpoint(spec_for(path.as_uri(), sha), max_bytes=1 << 20)
