"""Large values kept in files beside the RocksDB database, with a small reference in their key.

What this module is: the file side of :class:`storage.rocks.RocksStore`'s value separation.
The store writes a value of :data:`storage.schema.EXTERNAL_VALUE_KEYSPACES` that is at least
its threshold long (64 KiB by default) to a file of its own in ``<store>/values/`` and puts a
43-byte reference (:func:`encode_ref`) under the key, in the same atomic batch as the rest of
the transition; a read of the key reads the file. It is NOT the key layout (the keyspaces are
declared in :mod:`storage.schema`) and it holds no protocol rules.

Why: every byte through RocksDB's write-ahead log is checksummed with CRC32C, and the
published rocksdict wheels (0.3.29) build RocksDB without SSE4.2, so it is a table-driven CRC
at ~0.9 GB/s: a 1 MiB submission spent ~1.2 ms in ``crc32c::Extend``, a third of its whole
acceptance, then ~0.5 ms copying the value into the memtable, and RocksDB wrote it a second
time when it flushed. A 1 MiB file write costs ~0.28 ms (2026-11-27, 2-core machine;
docs/storage.md "Large values").

A file is written once and never changed: a new value for the key gets a new file, and the old
one is removed after the batch that replaced or deleted it is written. So a file can be
hard-linked into a checkpoint, and an acknowledged batch never names a half-written file.

A read-only opener beside the writer (``tenzro audit`` beside a running node) sees the store as
of its open, but the writer goes on replacing values (a model snapshot every few rounds) and
removing their files. So a reader hard-links every value file into a directory of its own
(:meth:`ExternalValues.pin`, ``values/.reader-<pid>-<random>``; ~10 us a file) before and after
it opens the database, checks that every file its view names is linked (the store opens a newer
view otherwise) and reads from there first: a file its view names cannot disappear under it.
RocksDB's own blob files, tried first, had exactly that failure (docs/storage.md "Large values").

Written files are taken out of the page cache once written back (:meth:`ExternalValues._drop_cached`):
they are seldom read, and new page-cache pages are what made large writes slow on a VM that hands
its free memory back to its host.

File format: :data:`FILE_MAGIC`, the column family's name (u8 length + UTF-8), the key (u16
big-endian length + bytes), then the value. The header lets an open find files that no key
names (a writer killed between its file and its batch, a removal a crash cut short) without
scanning the store, and lets a read refuse a file that is not the key's.
"""

from __future__ import annotations

import collections
import fcntl
import logging
import os
import queue
import secrets
import shutil
import struct
import threading
import time
import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from typing import BinaryIO, Final

from storage.files import fsync_directory
from storage.interface import StorageError

log = logging.getLogger(__name__)

__all__ = [
    "DIRECTORY",
    "EXTERNAL_VALUE_BYTES",
    "FILE_MAGIC",
    "MAX_FILE_KEY_BYTES",
    "REF_MAGIC",
    "REF_SIZE",
    "ExternalFile",
    "ExternalValues",
    "decode_ref",
    "encode_ref",
]

EXTERNAL_VALUE_BYTES: Final = 64 << 10
"""Default size from which a value of an external keyspace goes to a file. A file costs a
create and a close (~10-50 us here) where RocksDB costs ~1.6 us per KiB: even at 64 KiB the
file is cheaper, and smaller values (tiny test models) stay in the key."""

DIRECTORY: Final = "values"
"""The subdirectory of the store's directory that holds the files. RocksDB leaves names it
does not know alone, and its checkpoint copies none of them (``RocksStore.create_checkpoint``
links them)."""

REF_MAGIC: Final = b"\xff\xff\xff\xfftenzro:external"
"""The first 19 bytes of every reference. No value a version before this one stored in an
external keyspace begins with them: a payload begins with its u64 little-endian header length
(these 8 bytes read as ~8.8e18, far past any payload's size), a model fragment with a finite
fp32 (0xFFFFFFFF is a NaN). A value written now that begins with them is stored in a file
whatever its size, so a value stored in the key itself never does."""

_REF = struct.Struct(f">{len(REF_MAGIC)}s16sQ")
REF_SIZE: Final = _REF.size
FILE_MAGIC: Final = b"TZXV\x00\x01\x00\x00"
"""The first 8 bytes of every value file (format version 1)."""
MAX_FILE_KEY_BYTES: Final = 0xFFFF
"""The longest key a file's header can name; a value under a longer key stays in the key."""
_HEADER_READ: Final = 1024
"""Bytes of a file's start the sweep reads for its header: more than any key of the schema
needs; a longer header reads as cut short (then the sweep scans the references)."""
_READER_PREFIX: Final = ".reader-"
_PINNING_PREFIX: Final = ".pinning-"
_PINNING_MAX_AGE_S: Final = 3600.0
_LOCK_NAME: Final = "lock"
_HEX: Final = frozenset("0123456789abcdef")


def _is_file_name(entry: str) -> bool:
    return len(entry) == 32 and set(entry) <= _HEX


def encode_ref(name: bytes, size: int) -> bytes:
    """The reference stored under the key: magic, the file's 16-byte name, the value's size."""
    return _REF.pack(REF_MAGIC, name, size)


def decode_ref(value: bytes) -> tuple[bytes, int] | None:
    """``(name, size)`` of a reference; None for a value stored in the key itself."""
    if len(value) != REF_SIZE or not value.startswith(REF_MAGIC):
        return None
    _, name, size = _REF.unpack(value)
    return name, size


@dataclass(frozen=True)
class ExternalFile:
    """A value file on disk, as its header names it."""

    name: bytes
    cf: str
    key: bytes


DROP_LAG: Final = 8
"""Files written since, before a written file's pages are asked out of the page cache again."""

MAX_DROP_BACKLOG: Final = 64
"""Files waiting for the dropping thread, past which a writer closes its file itself (its pages,
still dirty, then stay cached): each waiting file holds a descriptor."""


_FADVISE: Final = getattr(os, "posix_fadvise", None)
"""None where the platform has no posix_fadvise (macOS): files are then closed at once."""


def advise(fd: int) -> None:
    """``POSIX_FADV_DONTNEED`` on all of ``fd``: starts writing back its dirty pages and drops
    its clean ones. Advice only: a failure (a filesystem that takes none) changes nothing."""
    if _FADVISE is None:
        return
    try:
        _FADVISE(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    except OSError:
        pass


def _drop_and_close(fd: int) -> None:
    """Advise ``fd`` out of the cache and close it. Its file was written (and fsynced where
    that was asked) before its batch: a close's error changes nothing that was acknowledged."""
    try:
        advise(fd)
    finally:
        try:
            os.close(fd)
        except OSError:
            pass


class _Dropper:
    """A thread that takes written files out of the page cache (:meth:`ExternalValues._drop_cached`),
    so that the writer pays only its ``writev``: starting a file's writeback (ext4 allocates
    its blocks then) cost the service thread ~0.15 ms per MiB. Holds no reference to its
    store, so a store dropped without its close is still collected (its finalizer stops this)."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[int | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="tenzro-value-files", daemon=True)
        self._thread.start()

    def put(self, fd: int) -> None:
        if self._queue.qsize() >= MAX_DROP_BACKLOG:
            _drop_and_close(fd)
        else:
            self._queue.put(fd)

    def stop(self) -> None:
        """Drop and close every file handed over so far, then end the thread."""
        self._queue.put(None)
        if self._thread is not threading.current_thread():
            self._thread.join()

    def _run(self) -> None:
        held: collections.deque[int] = collections.deque()
        while (fd := self._queue.get()) is not None:
            held.append(fd)
            try:
                advise(fd)  # starts its writeback
                if len(held) > DROP_LAG:
                    _drop_and_close(held.popleft())  # written back by now: its pages go
            except Exception:  # nothing expected; the thread must live on to close the rest
                log.exception("dropping a value file from the page cache failed")
        for fd in held:
            try:
                _drop_and_close(fd)
            except Exception:
                log.exception("dropping a value file from the page cache failed")


def _header(cf: str, key: bytes) -> bytes:
    cf_bytes = cf.encode()
    return FILE_MAGIC + bytes((len(cf_bytes),)) + cf_bytes + struct.pack(">H", len(key)) + key


def _parse_header(data: bytes) -> tuple[str, bytes] | None:
    """``(cf, key)`` from a file's first bytes; None if they are not a header."""
    if not data.startswith(FILE_MAGIC) or len(data) < len(FILE_MAGIC) + 1:
        return None
    at = len(FILE_MAGIC)
    cf_len = data[at]
    at += 1
    if len(data) < at + cf_len + 2:
        return None
    try:
        cf = data[at:at + cf_len].decode()
    except UnicodeDecodeError:
        return None
    at += cf_len
    (key_len,) = struct.unpack_from(">H", data, at)
    at += 2
    if len(data) < at + key_len:
        return None
    return cf, data[at:at + key_len]


class ExternalValues:
    """The value files of one store, in ``directory``.

    ``sync``: each new file is fsynced, and the directory once per batch, before the batch that
    names them is written (the store's ``sync=True``); without it a file is in the page cache,
    as the write-ahead log is, and survives the process being killed, not a power loss (a read
    of a file that lost its data then fails with StorageError, never returns other bytes of
    the right size silently: the size and the header are checked).
    """

    def __init__(self, directory: str, *, sync: bool) -> None:
        self._dir = directory
        self._sync = sync
        self._pinned: str | None = None  # a reader's links to the files as of its open
        self._linked: set[str] = set()  # the names linked there
        self._seen = False  # a listing found a value file (linked or gone by then)
        self._unpinnable = False  # links refused (another user's files): read in place
        self._lock_fd: int | None = None  # flock'ed while this reader's links are in use
        self._dropper: _Dropper | None = None  # started at the first file written
        self._dropper_lock = threading.Lock()
        self._released = False  # release_cached ran: no new dropper

    def _path(self, name: bytes) -> str:
        return os.path.join(self._dir, name.hex())

    def _paths(self, name: bytes) -> list[str]:
        """Where file ``name`` is read from: this reader's link first, if it made one."""
        live = self._path(name)
        if self._pinned is not None and name.hex() in self._linked:
            return [os.path.join(self._pinned, name.hex()), live]
        return [live]

    def create_directory(self) -> None:
        try:
            os.mkdir(self._dir)  # 0o777 less the umask, as RocksDB makes its files
        except FileExistsError:
            if not os.path.isdir(self._dir):
                raise StorageError(f"{self._dir!r} exists and is not a directory") from None
            return
        except OSError as error:
            raise StorageError(f"cannot create {self._dir!r}: {error.strerror or error}") from None
        if self._sync:
            fsync_directory(os.path.dirname(self._dir))

    def write(self, cf: str, key: bytes, value: bytes, *, durable: bool = False) -> bytes:
        """Write ``value`` to a new file and return its name (16 random bytes); fsynced with
        ``sync`` or ``durable``. StorageError on failure, with nothing left behind."""
        header = _header(cf, key)  # before the file: a key too long for it raises here
        name = secrets.token_bytes(16)
        path = self._path(name)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
        except OSError as error:
            raise StorageError(f"cannot create value file {path!r}: {error.strerror or error}") from None
        try:
            try:
                parts = [memoryview(header), memoryview(value)]
                while parts:  # writev may write less than asked (a signal, a full disk)
                    written = os.writev(fd, parts)
                    if written == 0:
                        raise OSError("write returned 0")
                    while parts and written >= len(parts[0]):
                        written -= len(parts[0])
                        parts.pop(0)
                    if parts and written:
                        parts[0] = parts[0][written:]
                if self._sync or durable:
                    os.fsync(fd)
            except BaseException:
                os.close(fd)
                raise
            self._drop_cached(fd)
        except BaseException as error:
            self.remove([name])
            if isinstance(error, OSError):
                raise StorageError(f"cannot write value file {path!r}: {error.strerror or error}") from None
            raise
        return name

    def _drop_cached(self, fd: int) -> None:
        """Hand a file just written (``fd``) to the store's :class:`_Dropper`, which takes its
        pages out of the page cache once the kernel has written them: it asks at once, which
        starts their writeback, and asks again and closes the file once :data:`DROP_LAG` more
        files were written (dirty pages, and pages still under writeback, stay where they are;
        the second ask finds them clean).

        Why: a value file is written once and seldom read (a node holds what its open rounds
        need in its payload and model caches), so its pages only push others out of the cache,
        and writing into fresh page-cache pages is what made large writes slow on a VM whose
        free memory goes back to its host (virtio-balloon free page reporting, as on this
        project's machines): 1 MiB took ~2.6 ms into fresh pages, ~0.3-0.5 ms into pages the
        kernel had just freed, and a ~100 MB model snapshot ~0.25 s more than it needed.
        Dropped pages are what the next files are written into, as PostgreSQL's ring buffers
        recycle a bulk write's pages (docs/storage.md "Large values").

        Without ``posix_fadvise`` (macOS), after :meth:`release_cached`, or when no thread can
        be started, the file is closed here at once: never an error for a write that was made."""
        try:
            with self._dropper_lock:
                if _FADVISE is not None and not self._released:
                    if self._dropper is None:
                        self._dropper = _Dropper()
                        weakref.finalize(self, self._dropper.stop)
                    self._dropper.put(fd)
                    return
        except Exception:  # no thread to be had (a thread limit): the write itself stands
            log.warning("cannot hand a value file to the page-cache thread", exc_info=True)
        _drop_and_close(fd)

    def release_cached(self) -> None:
        """Drop and close every file handed to the dropper, and stop it (the store's close); a
        file written after this (a write racing the close) is closed by its writer."""
        with self._dropper_lock:
            dropper, self._dropper = self._dropper, None
            self._released = True
        if dropper is not None:
            dropper.stop()

    def sync_directory(self, *, force: bool = False) -> None:
        """Make the names of the files written so far durable (with ``sync``, or ``force``)."""
        if self._sync or force:
            try:
                fsync_directory(self._dir)
            except OSError as error:
                raise StorageError(f"cannot sync {self._dir!r}: {error.strerror or error}") from None

    def read(self, cf: str, key: bytes, name: bytes, size: int) -> bytes:
        """The value of ``cf[key]`` from its file; StorageError if the file is missing, is not
        this key's, or does not hold ``size`` bytes of value."""
        return self.read_opened(self.open(cf, key, name), cf, key, size)

    def open(self, cf: str, key: bytes, name: bytes) -> BinaryIO:
        """The file ``name`` of ``cf[key]``, open (a reader's pinned link first). Once open it
        can be read whole even if it is removed meanwhile."""
        *pinned, path = self._paths(name)
        for link in pinned:
            try:
                return open(link, "rb", buffering=0)
            except OSError:
                pass  # the links are gone (removed by a writer that took this reader for dead)
        try:
            return open(path, "rb", buffering=0)
        except FileNotFoundError:
            raise StorageError(
                f"value file {path!r} of {cf}[{key.hex()}] is missing (lost, or removed by the store's "
                f"writer: a power loss after a recovery that dropped logged batches can do that)"
            ) from None
        except OSError as error:
            raise StorageError(f"cannot read value file {path!r}: {error.strerror or error}") from None

    def holds(self, cf: str, key: bytes, name: bytes, size: int) -> bool:
        """Whether file ``name`` is there with the size a value of ``size`` bytes under
        ``cf[key]`` gives it (a stat; the header is not read)."""
        expected = len(_header(cf, key)) + size
        for path in self._paths(name):
            try:
                return os.stat(path).st_size == expected
            except FileNotFoundError:
                continue
            except OSError as error:
                raise StorageError(f"cannot read value file {path!r}: {error.strerror or error}") from None
        return False

    def read_opened(self, fh: BinaryIO, cf: str, key: bytes, size: int) -> bytes:
        """:meth:`read` of a file :meth:`open` returned (closed here)."""
        header = _header(cf, key)
        path = fh.name
        try:
            with fh:
                head = fh.read(len(header))
                if head != header:
                    raise StorageError(f"value file {path!r} of {cf}[{key.hex()}] is damaged or another key's")
                value = fh.read(size + 1)
        except OSError as error:
            raise StorageError(f"cannot read value file {path!r}: {error.strerror or error}") from None
        if len(value) != size:
            raise StorageError(f"value file {path!r} of {cf}[{key.hex()}] holds {len(value)} bytes of "
                               f"value, its reference says {size}: it is damaged")
        return value

    def pin(self) -> None:
        """Link every value file not linked yet into a directory of this reader's own (see the
        module docstring). The store calls it before and after its open, then checks with
        :meth:`is_pinned` that every file its view names is linked. StorageError if the links
        cannot be made; where they are not permitted (an auditor running as another user than
        the node: no write access to ``values/``, or ``fs.protected_hardlinks`` refusing links to
        another user's files), the reader reads the files in place, without the guarantee."""
        if self._unpinnable or not os.path.isdir(self._dir):
            return  # no file yet: any a view names was written since, and is read in place
        if self._pinned is None:
            try:
                self._pinned = self._make_reader_directory()
            except PermissionError:  # no write access to values/ (another user): read in place
                self._unpinnable = True
                return
            except OSError as error:
                raise StorageError(f"cannot pin the value files of a read-only open in {self._dir!r}: "
                                   f"{error.strerror or error}") from None
        try:
            for entry in os.listdir(self._dir):
                if _is_file_name(entry) and entry not in self._linked:
                    self._seen = True
                    try:
                        os.link(os.path.join(self._dir, entry), os.path.join(self._pinned, entry))
                    except FileNotFoundError:
                        continue  # removed since the listing
                    self._linked.add(entry)
        except PermissionError:
            self.unpin()
            self._unpinnable = True
        except OSError as error:
            where = self._pinned
            self.unpin()
            raise StorageError(f"cannot pin the value files of a read-only open in {where!r}: "
                               f"{error.strerror or error}") from None

    def _make_reader_directory(self) -> str:
        """A new ``.reader-*`` directory holding a ``lock`` file this reader keeps flock'ed, so
        a writer can tell a live reader from a dead one in any PID namespace (a pid test took a
        reader in another container for dead and removed its links: review). Made under a
        ``.pinning-*`` name and renamed once locked, so no writer sees it unlocked."""
        token = f"{os.getpid()}-{secrets.token_hex(4)}"
        making = os.path.join(self._dir, f"{_PINNING_PREFIX}{token}")
        os.mkdir(making)
        try:
            fd = os.open(os.path.join(making, _LOCK_NAME), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                final = os.path.join(self._dir, f"{_READER_PREFIX}{token}")
                os.rename(making, final)
            except BaseException:
                os.close(fd)
                raise
        except BaseException:
            shutil.rmtree(making, ignore_errors=True)
            raise
        self._lock_fd = fd
        return final

    def has_files(self) -> bool:
        """Whether this reader's listings found any value file to pin (else there is nothing
        for its view to name but missing files, and no reason to check it)."""
        return self._seen and not self._unpinnable

    def is_pinned(self, name: bytes) -> bool:
        """Whether a read of file ``name`` is safe from its removal (linked, or links refused)."""
        return self._unpinnable or name.hex() in self._linked

    def unpin(self) -> None:
        """Remove this reader's links (the close of a read-only open)."""
        self._linked = set()
        self._seen = False
        pinned, self._pinned = self._pinned, None
        if pinned is not None:
            shutil.rmtree(pinned, ignore_errors=True)
        fd, self._lock_fd = self._lock_fd, None
        if fd is not None:
            os.close(fd)

    def remove_dead_readers(self) -> None:
        """Remove the pinned directories of readers that are gone (killed before their close):
        their ``lock`` is free. A ``.pinning-*`` directory is a reader that died while making
        its directory (or one doing so now): removed once an hour old."""
        try:
            entries = os.listdir(self._dir)
        except OSError:
            return
        for entry in entries:
            path = os.path.join(self._dir, entry)
            if entry.startswith(_PINNING_PREFIX):
                try:
                    if time.time() - os.stat(path).st_mtime > _PINNING_MAX_AGE_S:
                        shutil.rmtree(path, ignore_errors=True)
                except OSError:
                    pass
                continue
            if not entry.startswith(_READER_PREFIX):
                continue
            try:
                fd = os.open(os.path.join(path, _LOCK_NAME), os.O_RDWR | os.O_CLOEXEC)
            except FileNotFoundError:
                shutil.rmtree(path, ignore_errors=True)  # an older version's, or half removed
                continue
            except OSError:
                continue  # another user's: not ours to judge
            try:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except OSError:
                    continue  # held: the reader is alive
                shutil.rmtree(path, ignore_errors=True)
            finally:
                os.close(fd)

    def remove(self, names: list[bytes]) -> None:
        """Remove files (ones already gone are skipped); failures are left for the next open's
        sweep, whose job this is after a crash anyway."""
        for name in names:
            try:
                os.unlink(self._path(name))
            except OSError:
                pass

    def scan(self) -> Iterator[ExternalFile | bytes]:
        """Every value file: an :class:`ExternalFile` when its header reads, else its name (a
        file cut short before its header, by a crash). Names that are not a file's are skipped."""
        try:
            entries = os.listdir(self._dir)
        except FileNotFoundError:
            return
        except OSError as error:
            raise StorageError(f"cannot list {self._dir!r}: {error.strerror or error}") from None
        for entry in sorted(entries):
            if not _is_file_name(entry):
                continue
            name = bytes.fromhex(entry)
            path = os.path.join(self._dir, entry)
            try:
                with open(path, "rb", buffering=0) as fh:
                    parsed = _parse_header(fh.read(_HEADER_READ))
            except OSError:
                continue
            yield ExternalFile(name, *parsed) if parsed is not None else name

    def link_into(self, directory: str) -> None:
        """Hard-link (copy across filesystems) every value file into ``directory`` (created):
        the file side of a checkpoint. Files are never changed, so a link is a copy."""
        try:
            os.mkdir(directory)
            for entry in os.listdir(self._dir) if os.path.isdir(self._dir) else []:
                if not _is_file_name(entry):
                    continue
                source, target = os.path.join(self._dir, entry), os.path.join(directory, entry)
                try:
                    os.link(source, target)
                except FileNotFoundError:
                    continue  # removed since the listing: no key names it
                except OSError:  # another filesystem: a copy
                    shutil.copyfile(source, target)
                # Durable as RocksDB makes its part of a checkpoint (a file written without sync
                # may not be on disk yet; once written back, this fsync costs little).
                with open(target, "rb") as fh:
                    os.fsync(fh.fileno())
            fsync_directory(directory)
            fsync_directory(os.path.dirname(directory))
        except OSError as error:
            raise StorageError(f"cannot copy value files to {directory!r}: {error.strerror or error}") from None
