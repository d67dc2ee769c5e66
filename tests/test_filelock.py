"""tenzro_training.filelock: the flock a store directory, a peer key or a trainer's payload
directory is held by. A refusal says "held" only when another holder has it, and no attempt
leaves a descriptor behind (a node retries its lock at every start)."""

from __future__ import annotations

import errno
import fcntl
import os
from pathlib import Path

import pytest

from tenzro_training.filelock import try_lock_directory, try_lock_exclusive


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts descriptors in /proc")


def test_a_held_lock_is_refused_without_leaking_a_descriptor(tmp_path: Path) -> None:
    held = try_lock_directory(tmp_path / "store")
    assert held is not None
    try:
        before = _open_fds()
        for _ in range(5):
            assert try_lock_directory(tmp_path / "store") is None
        assert _open_fds() == before
    finally:
        os.close(held)
    again = try_lock_directory(tmp_path / "store")  # released with its descriptor
    assert again is not None
    os.close(again)


def test_invalid_directory_lock_on_a_file(tmp_path: Path) -> None:
    path = tmp_path / "file"
    path.write_bytes(b"")
    before = _open_fds()
    with pytest.raises(NotADirectoryError):
        try_lock_exclusive(path, directory=True)
    assert _open_fds() == before
    fd = try_lock_exclusive(path)  # a file lock of the same path is fine
    assert fd is not None
    os.close(fd)


@pytest.mark.parametrize("failure", [OSError(errno.ENOLCK, "No locks available"), KeyboardInterrupt()],
                         ids=["ENOLCK", "KeyboardInterrupt"])
def test_a_flock_failure_is_raised_not_taken_for_another_holder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failure: BaseException
) -> None:
    """Only "would block" means another holder: any other failure (a filesystem without locks,
    an interrupt) propagates, and the descriptor opened for it is closed."""

    def flock(fd: int, operation: int) -> None:
        raise failure

    before = _open_fds()
    monkeypatch.setattr(fcntl, "flock", flock)
    with pytest.raises(type(failure)):
        try_lock_exclusive(tmp_path)
    assert _open_fds() == before
