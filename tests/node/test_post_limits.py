"""postTask's node policy (malicious-participant probe, stop 20): a post costs the node a model
snapshot on disk and a layout in memory, so it must carry a reward pool (``min_reward_pool``),
open runs are bounded per node and per sponsor (``max_open_runs``, ``max_open_runs_per_sponsor``),
and a checkpoint is refused on its hash or its tensor count before it is held in memory."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
import torch

from rpc.errors import compute_error_object
from tenzro_training import auth
from storage import schema
from storage.files import FileDigests
from storage.memory import MemoryStore
from tenzro_training.errors import CheckpointError, SpecError, TooManyRuns
from tenzro_training.node import checkpoint as checkpoint_module
from tenzro_training.node.service import NodeService
from tests.node.conftest import SPONSOR, STRANGER, FakeClock, Net, make_config, spec_dict, write_checkpoint


def _net(tmp_path: Path, **config: object) -> Net:
    return Net(NodeService(make_config(None, **config), MemoryStore(), clock=FakeClock()), FakeClock())


def test_a_post_needs_the_nodes_minimum_pool(tmp_path: Path) -> None:
    net = _net(tmp_path)
    uri, sha = write_checkpoint(tmp_path)
    with pytest.raises(SpecError) as info:
        net.post(spec_dict(uri, sha, reward_pool="0"))
    assert info.value.path == "reward_pool" and "below this node's minimum, 1 attoTNZO" in str(info.value)
    assert net.service.get_run_state("run-1") is None
    assert not list(net.store.iterate(schema.CF_TRAINING_RUNS))  # nothing written
    priced = _net(tmp_path, min_reward_pool=1000)
    with pytest.raises(SpecError, match="below this node's minimum"):
        priced.post(spec_dict(uri, sha, reward_pool="999"))
    priced.post(spec_dict(uri, sha, reward_pool="1000"))


def test_open_runs_are_bounded_per_node_and_per_sponsor(tmp_path: Path) -> None:
    uri, sha = write_checkpoint(tmp_path)
    net = _net(tmp_path, max_open_runs=3, max_open_runs_per_sponsor=2)
    net.post(spec_dict(uri, sha, task_id="a"))
    net.post(spec_dict(uri, sha, task_id="b"))
    with pytest.raises(TooManyRuns) as info:
        net.post(spec_dict(uri, sha, task_id="c"))
    assert (info.value.scope, info.value.limit) == ("sponsor", 2)
    assert compute_error_object(info.value)["code"] == 1317
    assert compute_error_object(info.value)["data"] == {"type": "TooManyRuns", "task_id": "c", "scope": "sponsor",
                                                        "limit": 2}
    net.post(spec_dict(uri, sha, task_id="a"))  # the same spec again is still a no-op replay
    other = spec_dict(uri, sha, task_id="d", sponsor_address=STRANGER.text)
    net.post(other, signer=STRANGER)  # another sponsor: the node's third open run
    with pytest.raises(TooManyRuns) as node_full:
        net.post(spec_dict(uri, sha, task_id="e", sponsor_address=STRANGER.text), signer=STRANGER)
    assert node_full.value.scope == "node"
    net.service.cancel_task("a", SPONSOR.sign(auth.CancelTask(task_id="a")))
    net.post(spec_dict(uri, sha, task_id="c"))  # an ended run frees its slot


def test_a_wrong_hash_is_refused_before_the_file_is_held(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A post naming any large readable file with a wrong hash read it whole (twice its size at
    the peak) before refusing it; now a streamed hash refuses it first."""
    uri, sha = write_checkpoint(tmp_path)
    read_whole: list[Path] = []
    real = checkpoint_module._read_bounded
    monkeypatch.setattr(checkpoint_module, "_read_bounded",
                        lambda path, uri, max_bytes: read_whole.append(path) or real(path, uri, max_bytes))
    net = _net(tmp_path)
    with pytest.raises(CheckpointError, match="sha256 is 0x.*(streamed)"):
        net.post(spec_dict(uri, "0x" + "00" * 32))
    assert read_whole == []
    net.post(spec_dict(uri, sha))
    assert len(read_whole) == 1


def test_a_checkpoint_of_too_many_tensors_is_refused_before_it_is_parsed(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(checkpoint_module, "MAX_CHECKPOINT_TENSORS", 4)
    state = {f"t{i}": torch.zeros(1) for i in range(5)}
    uri, sha = write_checkpoint(tmp_path, state)
    with pytest.raises(CheckpointError, match="more than 4 tensors"):
        _net(tmp_path).post(spec_dict(uri, sha))
    header = b'{"a":' * 2  # a header length past the file
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(struct.pack("<Q", 1 << 40) + header)
    with pytest.raises(CheckpointError, match="not a valid safetensors file"):
        checkpoint_module.parse_checkpoint_bytes(bad.read_bytes(), bad.as_uri())


def test_a_file_hashed_before_is_not_read_again_until_it_changes(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Any sponsor may name any readable file with a wrong hash: each refused post read the
    whole file again. An unchanged file (same inode, size, mtime, ctime) costs a stat."""
    import os

    uri, sha = write_checkpoint(tmp_path)
    path = tmp_path / "init.safetensors"
    digests = FileDigests(settled_ns=0)  # the file was just written
    monkeypatch.setattr(checkpoint_module, "FILE_DIGESTS", digests)
    net = _net(tmp_path)
    for wrong in ("00", "11", "22"):
        with pytest.raises(CheckpointError, match="sha256 is 0x.*(streamed)"):
            net.post(spec_dict(uri, "0x" + wrong * 32))
    assert digests.hashed == 1  # one pass for the three posts
    data = path.read_bytes()
    path.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))  # changed: hashed again
    os.utime(path, ns=(1, 1))
    with pytest.raises(CheckpointError, match="sha256 is 0x.*(streamed)"):
        net.post(spec_dict(uri, sha))
    assert digests.hashed == 2


def test_a_file_changed_within_the_last_seconds_is_not_remembered(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Review (stop 20): a rewrite within one timestamp tick keeps the key; a digest of a file
    changed less than 2 s ago is therefore not remembered (git's "racy" rule)."""
    uri, _ = write_checkpoint(tmp_path)
    digests = FileDigests()
    monkeypatch.setattr(checkpoint_module, "FILE_DIGESTS", digests)
    checkpoint_module._stream_sha256(tmp_path / "init.safetensors", uri, 1 << 30)
    assert len(digests) == 0


def test_the_header_count_needs_no_parse(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Review (stop 20): the pre-check parsed the header in Python, ~3 s for a hostile 16 MiB one
    the library refuses in 2 ms. It counts the tensor entries' key instead."""
    import json

    monkeypatch.setattr(checkpoint_module, "MAX_CHECKPOINT_TENSORS", 2)
    body = {f"t{i}": {"dtype": "F32", "shape": [1], "data_offsets": [4 * i, 4 * i + 4]} for i in range(3)}
    header = json.dumps({"__metadata__": {"note": "data_offsets"}, **body}).encode()
    data = struct.pack("<Q", len(header)) + header + bytes(12)
    with pytest.raises(CheckpointError, match="more than 2 tensors"):
        checkpoint_module.parse_checkpoint_bytes(data, "file:///x")
    monkeypatch.setattr(checkpoint_module, "MAX_CHECKPOINT_TENSORS", 4)  # the metadata value counts too
    assert len(checkpoint_module.parse_checkpoint_bytes(data, "file:///x")) == 3


def test_a_run_that_ends_before_training_leaves_no_snapshot(tmp_path: Path) -> None:
    """Review (stop 20): the pool minimum is a deposit a cancel refunds, and every post wrote a
    round-0 snapshot (8 bytes per parameter) that stayed: post, cancel, repeat filled the disk.
    A run that ends before any round was committed drops it (the checkpoint, pinned by the
    committed initial model hash, is the same bytes); `tenzro audit` still passes the run."""
    from tenzro_training.node.audit import audit_store

    uri, sha = write_checkpoint(tmp_path)
    net = _net(tmp_path, max_open_runs_per_sponsor=1)
    for i in range(5):
        net.post(spec_dict(uri, sha, task_id=f"r{i}"))
        net.service.cancel_task(f"r{i}", SPONSOR.sign(auth.CancelTask(task_id=f"r{i}")))
    assert not list(net.store.iterate(schema.CF_MODEL_STATE))
    assert all(net.store.get(schema.CF_META, schema.model_snapshot_key(f"r{i}")) is None for i in range(5))
    assert net.service._models == {}
    assert net.service.get_run("r4")["status"] == "Cancelled" and net.service.get_run("r4")["fragments"]
    assert [r.problem for r in audit_store(net.store, ["r0", "r4"])] == [None, None]


# --- the checkpoint read ahead of the post, off the service thread (preload_post_task) ------------


def _post_signature(spec: dict, signer: object = SPONSOR) -> bytes:
    from tenzro_training.spec import TrainingTaskSpec

    task = TrainingTaskSpec.from_dict(spec)
    return signer.sign(auth.PostTask(task_id=task.task_id, spec_hash=task.spec_hash()))  # type: ignore[attr-defined]


@pytest.fixture
def loads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The thread name of every init checkpoint read."""
    import threading

    import tenzro_training.node.service as service_module

    seen: list[str] = []
    real = service_module.load_init_checkpoint

    def load(*args: object, **kwargs: object) -> object:
        seen.append(threading.current_thread().name)
        return real(*args, **kwargs)

    monkeypatch.setattr(service_module, "load_init_checkpoint", load)
    return seen


def _preload_on_a_thread(net: Net, spec: dict, signature: bytes) -> None:
    import threading

    worker = threading.Thread(target=net.service.preload_post_task, args=(spec, signature), name="preloader")
    worker.start()
    worker.join(30)


def test_a_preloaded_post_reads_its_checkpoint_once_ahead_and_answers_the_same(tmp_path: Path, loads: list[str]) -> None:
    uri, sha = write_checkpoint(tmp_path)
    spec = spec_dict(uri, sha)
    plain, ahead = _net(tmp_path), _net(tmp_path)
    expected = plain.post(spec)
    assert loads == ["MainThread"]
    _preload_on_a_thread(ahead, spec, _post_signature(spec))
    assert loads == ["MainThread", "preloader"]
    assert ahead.post(spec) == expected and loads == ["MainThread", "preloader"]  # not read again
    from tests.node.conftest import snapshot

    assert snapshot(ahead.store) == snapshot(plain.store) and not ahead.service._preloaded


def test_a_preload_reads_nothing_for_a_stranger_or_a_held_task(tmp_path: Path, loads: list[str]) -> None:
    uri, sha = write_checkpoint(tmp_path)
    spec = spec_dict(uri, sha)
    net = _net(tmp_path)
    for bad in (_post_signature(spec, STRANGER), b"\x00" * 65):
        net.service.preload_post_task(spec, bad)
    net.service.preload_post_task({"task_id": "x"}, _post_signature(spec))  # not a spec
    assert loads == [] and not net.service._preloaded
    net.post(spec)
    net.service.preload_post_task(spec, _post_signature(spec))
    assert loads == ["MainThread"] and not net.service._preloaded


def test_a_preloaded_read_error_is_the_posts_answer(tmp_path: Path, loads: list[str]) -> None:
    uri, _sha = write_checkpoint(tmp_path)
    spec = spec_dict(uri, "0x" + "00" * 32)
    inline = _net(tmp_path)
    with pytest.raises(CheckpointError) as direct:
        inline.post(spec)
    net = _net(tmp_path)
    _preload_on_a_thread(net, spec, _post_signature(spec))
    with pytest.raises(CheckpointError) as ahead:
        net.post(spec)
    assert str(ahead.value) == str(direct.value) and loads == ["MainThread", "preloader"]
    assert not list(net.store.iterate(schema.CF_TRAINING_RUNS))


def test_a_refused_post_drops_its_preloaded_model_and_few_wait(tmp_path: Path, loads: list[str]) -> None:
    import tenzro_training.node.service as service_module

    uri, sha = write_checkpoint(tmp_path)
    net = _net(tmp_path, max_open_runs=1)
    later = spec_dict(uri, sha, task_id="later")
    net.service.preload_post_task(later, _post_signature(later))  # admissible now: read
    assert len(net.service._preloaded) == 1 and loads == ["MainThread"]
    net.post(spec_dict(uri, sha, task_id="open"))  # (its own read: no preload)
    with pytest.raises(TooManyRuns):
        net.post(later)
    assert not net.service._preloaded  # not left waiting for a post that will not come
    # A post the node would refuse before reading its checkpoint is not read ahead either.
    net.service.preload_post_task(later, _post_signature(later))
    poor = spec_dict(uri, sha, task_id="poor", reward_pool=str(10**40))
    net.service.preload_post_task(poor, _post_signature(poor))
    assert loads == ["MainThread", "MainThread"] and not net.service._preloaded
    wide = _net(tmp_path)
    for i in range(service_module.PRELOADED_POSTS + 2):
        other = spec_dict(uri, sha, task_id=f"ahead-{i}")
        wide.service.preload_post_task(other, _post_signature(other))
    kept = range(2, service_module.PRELOADED_POSTS + 2)  # the last PRELOADED_POSTS, in order
    assert [k[0] for k in wide.service._preloaded] == [f"ahead-{i}" for i in kept]


def test_a_preloaded_error_holds_no_frames(tmp_path: Path, loads: list[str]) -> None:
    """The error waits without its traceback: its frames held the file's bytes and every tensor
    parsed before the failing one (2-4 times the file) for as long as it waited."""
    state = {"a": torch.zeros(1000), "z": torch.tensor([float("nan")])}
    uri, sha = write_checkpoint(tmp_path, state)
    spec = spec_dict(uri, sha)
    net = _net(tmp_path)
    _preload_on_a_thread(net, spec, _post_signature(spec))
    ((_mark, error),) = net.service._preloaded.values()
    assert isinstance(error, CheckpointError) and error.__traceback__ is None
    with pytest.raises(CheckpointError, match="NaN"):
        net.post(spec)


def test_a_preloaded_split_error_holds_no_frames(tmp_path: Path, loads: list[str]) -> None:
    """fragment_count past the model's elements: a SpecError raised ``from None`` over a
    FragmentError whose frames held the whole fp32 state."""
    uri, sha = write_checkpoint(tmp_path)
    spec = spec_dict(uri, sha)
    spec["architecture"]["fragment_count"] = 64
    net = _net(tmp_path)
    _preload_on_a_thread(net, spec, _post_signature(spec))
    ((_mark, error),) = net.service._preloaded.values()
    assert isinstance(error, SpecError) and error.__traceback__ is None and error.__context__ is None
    with pytest.raises(SpecError, match="cannot split"):
        net.post(spec)


def test_a_post_the_ledger_refuses_is_refused_before_its_checkpoint_is_read(tmp_path: Path, loads: list[str]) -> None:
    """Every refusal the core can make comes before the file is touched: a sponsor without the
    pool cannot make the node read (up to max_checkpoint_bytes of) a checkpoint."""
    from tenzro_training.ledger import InsufficientBalance

    uri, sha = write_checkpoint(tmp_path)
    net = _net(tmp_path)
    with pytest.raises(InsufficientBalance):
        net.post(spec_dict(uri, sha, reward_pool=str(10**12)))
    missing = (tmp_path / "gone.safetensors").as_uri()
    with pytest.raises(InsufficientBalance):  # not the CheckpointError the read would give
        net.post(spec_dict(missing, sha, reward_pool=str(10**12)))
    assert loads == [] and not list(net.store.iterate(schema.CF_TRAINING_RUNS))


def test_a_preload_reads_nothing_once_closed_or_for_an_ended_task(tmp_path: Path, loads: list[str]) -> None:
    uri, sha = write_checkpoint(tmp_path)
    spec = spec_dict(uri, sha)
    net = _net(tmp_path)
    net.post(spec)
    net.service.cancel_task("run-1", SPONSOR.sign(auth.CancelTask(task_id="run-1")))
    assert net.service.preload_post_task(spec, _post_signature(spec)) is None  # ended: the post is a replay
    closed = _net(tmp_path)
    closed.service.close()
    assert closed.service.preload_post_task(spec, _post_signature(spec)) is None
    assert loads == ["MainThread"] and not net.service._preloaded and not closed.service._preloaded


def test_an_ended_request_drops_only_its_own_preloaded_read(tmp_path: Path, loads: list[str]) -> None:
    """Two requests preloading the same post: the first one's end must not drop what the
    second read (its post would read the file again on the service thread)."""
    uri, sha = write_checkpoint(tmp_path)
    spec = spec_dict(uri, sha)
    net = _net(tmp_path)
    first = net.service.preload_post_task(spec, _post_signature(spec))
    second = net.service.preload_post_task(spec, _post_signature(spec))
    assert first is not None and second is not None and loads == ["MainThread", "MainThread"]
    net.service.discard_preloaded(first)
    assert len(net.service._preloaded) == 1
    net.post(spec)
    assert loads == ["MainThread", "MainThread"] and not net.service._preloaded  # the second read served it
    net.service.discard_preloaded(second)  # its request ends after the post took it: nothing left
    assert not net.service._preloaded
