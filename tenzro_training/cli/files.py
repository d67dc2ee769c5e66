"""Files the user names: specs, keys, payloads and checkpoints read with bounds and clear
refusals, and ``--out`` files written whole or not at all."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from tenzro_training.cli.exits import CliError


MAX_INPUT_FILE_BYTES = 256 << 20
"""Largest spec, key, receipt or payload file read (above the node's 64 MiB payload default)."""
MAX_CHECKPOINT_FILE_BYTES = 16 << 30
"""Largest --checkpoint hashed, the node's max_checkpoint_bytes default."""


def read_text(path: str, what: str) -> str:
    """A UTF-8 text file the user named, or a CliError that says which and why (a FIFO or a
    device is refused at once instead of blocking or filling memory)."""
    from storage.files import NotReadable, read_regular_file

    try:
        return read_regular_file(path, MAX_INPUT_FILE_BYTES).decode("utf-8")
    except NotReadable as exc:
        raise CliError(f"cannot read {what} {path}: {exc.reason}") from None
    except UnicodeDecodeError:
        raise CliError(f"{what} {path} is not UTF-8 text") from None


def write_out(path: str, data: bytes) -> None:
    """Write an ``--out`` file as shell redirection would, and a regular file whole or not at all.

    A regular file (or a new one) is written atomically (a reader never sees half of it), with
    the mode a plain create would give (0666 less the umask: a user with umask 077 gets 0600);
    through a symlink, the link's target is the file replaced, the link stays. A device or a
    FIFO (``/dev/stdout``, ``/dev/null``, a named pipe) is written into. Missing directories
    are created (unlike the shell: tested, and documented). Until 2026-11-27 the atomic rename
    replaced a symlink, a FIFO or even ``/dev/full`` with a regular file (CLI probe)."""
    import stat

    from storage.files import write_file_atomically

    if path.endswith(("/", os.sep)):
        raise CliError(f"cannot write {path}: a directory path, not a file")
    try:
        info: os.stat_result | None = os.stat(path)  # through symlinks
    except FileNotFoundError:
        info = None
    except OSError as exc:
        raise CliError(f"cannot write {path}: {exc.strerror or exc}") from None
    try:
        if info is not None and stat.S_ISDIR(info.st_mode):
            raise CliError(f"cannot write {path}: Is a directory")
        if info is not None and not stat.S_ISREG(info.st_mode):
            with open(path, "wb") as fh:  # as `>` opens it; the buffered writer writes it all
                fh.write(data)
            return
        target = Path(os.path.realpath(path))  # a symlink (even dangling) names the file to write
        mask = os.umask(0)
        os.umask(mask)
        write_file_atomically(target, data, mode=0o666 & ~mask)
    except OSError as exc:
        raise CliError(f"cannot write {path}: {exc.strerror or exc}") from None


def read_checkpoint_file(path: str, max_bytes: int) -> bytes:
    from storage.files import NotReadable, read_regular_file

    try:
        return read_regular_file(path, max_bytes)
    except NotReadable as exc:
        raise CliError(f"cannot read checkpoint {path}: {exc.reason}") from None


def read_spec_file(path: str) -> Any:
    from tenzro_training.spec import TrainingTaskSpec

    return TrainingTaskSpec.from_json(read_text(path, "spec"), supported_only=False)


def checkpoint_path(uri: str) -> Path:
    # The node's own parse (one unquote; query, fragment and host refused): the CLI had unquoted
    # twice (url2pathname unquotes again), so a name holding "%" named another file than the node's.
    from tenzro_training.errors import CheckpointError
    from tenzro_training.node.checkpoint import resolve_checkpoint_path

    try:
        return resolve_checkpoint_path(uri, ())
    except CheckpointError as exc:
        raise CliError(f"init checkpoint {uri!r}: {exc.reason}") from None
