"""Benchmark the RocksDB store's large values: in files (schema 6) against in the key, in ONE run.

What it times, per value size (payload-sized 1 MiB and fragment-sized 4 MiB by default), on a
``RocksStore`` opened twice in the same temp directory's filesystem:

- baseline: every value in its key, through the write-ahead log and memtable
  (``external_value_bytes`` above any value: what a schema-5 store did);
- ours: the default, values of 64 KiB and more in files of ``values/`` with a 43-byte reference
  in the key (docs/storage.md "Large values").

For each: a fresh put (one batch per value, as a submission writes a payload), a get of every
value, and a replacing put (every key written again, as a model snapshot replaces the previous
one: ours then fsyncs the new files and syncs the log before removing the old files). The two
layouts alternate in blocks (``--blocks``) so that the machine's drift hits both alike, and
the best block of each is printed, with ours/baseline (below 1 is faster). No target: the
node's targets are end to end (``scripts/bench_rpc.py``); this isolates the store.

Usage::

    .venv/bin/python scripts/bench_store.py                  # ~15 s on 2 cores
    .venv/bin/python scripts/bench_store.py --sizes 1048576 --values 32 --blocks 2 --sync

Wall times on a shared machine are noisy: the load average is printed, and each block works
in a fresh directory. Ours takes each file out of the page cache once it is written back
(docs/storage.md "Large values", "Page cache"), so its gets of the values it has just put
read them from the disk; the baseline's come from memory.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from storage.rocks import RocksStore  # noqa: E402
from storage.schema import CF_MODEL_STATE, CF_SUBMISSIONS, model_key, payload_key  # noqa: E402

INLINE = 1 << 40  # no value reaches it: every value stays in its key


def _time_block(root: Path, threshold: int, values: list[bytes], sync: bool) -> dict[str, float]:
    """Seconds per value of a fresh put, a get and a replacing put, in a fresh store."""
    path = Path(tempfile.mkdtemp(dir=root)) / "db"
    payload_keys = [payload_key("bench", i.to_bytes(32, "big")) for i in range(len(values))]
    fragment_keys = [model_key("bench", b"w", i) for i in range(len(values))]
    out: dict[str, float] = {}
    try:
        with RocksStore(path, sync=sync, external_value_bytes=threshold) as store:
            t0 = time.perf_counter()
            for key, value in zip(payload_keys, values):
                with store.atomic_batch() as batch:
                    batch.put(CF_SUBMISSIONS, key, value)
            out["put"] = (time.perf_counter() - t0) / len(values)
            t0 = time.perf_counter()
            for key, value in zip(payload_keys, values):
                got = store.get(CF_SUBMISSIONS, key)
                assert got is not None and len(got) == len(value)
            out["get"] = (time.perf_counter() - t0) / len(values)
            with store.atomic_batch() as batch:
                for key, value in zip(fragment_keys, values):
                    batch.put(CF_MODEL_STATE, key, value)
            t0 = time.perf_counter()
            with store.atomic_batch() as batch:  # one snapshot replacing the previous one
                for key, value in zip(fragment_keys, reversed(values)):
                    batch.put(CF_MODEL_STATE, key, value)
            out["replace"] = (time.perf_counter() - t0) / len(values)
    finally:
        shutil.rmtree(path.parent, ignore_errors=True)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default=f"{1 << 20},{4 << 20}", help="comma-separated value sizes in bytes")
    parser.add_argument("--values", type=int, default=24, help="values per block")
    parser.add_argument("--blocks", type=int, default=3, help="alternating blocks per layout")
    parser.add_argument("--sync", action="store_true", help="open the stores with sync=True (fsync every batch)")
    args = parser.parse_args(argv)
    try:
        sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    except ValueError:
        parser.error("--sizes takes comma-separated integers")
    if not sizes or min(sizes) < 1 or args.values < 1 or args.blocks < 1:
        parser.error("--sizes, --values and --blocks must be positive")
    started = time.perf_counter()
    print(f"load average before: {os.getloadavg()[0]:.2f}  cpus: {os.cpu_count()}  sync={args.sync}", flush=True)
    with tempfile.TemporaryDirectory(prefix="bench-store-") as tmp:
        root = Path(tmp)
        print(f"  {'value':>9} {'operation':<10} {'in the key (ms)':>16} {'in files (ms)':>14} {'files/key':>10}")
        for size in sizes:
            values = [os.urandom(size) for _ in range(args.values)]
            best: dict[str, dict[str, float]] = {"key": {}, "files": {}}
            for _ in range(args.blocks):
                for layout, threshold in (("key", INLINE), ("files", 64 << 10)):
                    for op, seconds in _time_block(root, threshold, values, args.sync).items():
                        best[layout][op] = min(best[layout].get(op, seconds), seconds)
            for op in ("put", "get", "replace"):
                key_ms, files_ms = best["key"][op] * 1e3, best["files"][op] * 1e3
                print(f"  {size / (1 << 20):>7.2f}Mi {op:<10} {key_ms:>16.3f} {files_ms:>14.3f} {files_ms / key_ms:>9.2f}x",
                      flush=True)
    print(f"load average after: {os.getloadavg()[0]:.2f}; total {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
