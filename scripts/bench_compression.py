"""Benchmark the topk and q8 payload encodings against raw payloads of the same fragment, in the same run.

For one fragment of ``--params`` fp32 values (default 2^20, the size of ``bench_rpc.py``'s
fragments), each density in ``--densities`` (basis points) and each block size in
``--q8-blocks``, prints:

- ``bytes``: the compressed payload's size over the raw fp32 payload's (what a trainer uploads
  and the node stores);
- ``trainer``: the trainer's CPU time to make the payload, error feedback and top-k selection or
  quantisation included (``ErrorFeedback.compress`` + ``encode_topk_payload`` or
  ``encode_q8_payload``), over ``encode_payload`` of the raw vector;
- ``node decode``: ``decode_payload`` of the compressed payload (validation, scatter or scaling
  into the dense fp32 vector) over that of the raw payload, both as the node's submission check
  calls it (``zero_copy=True``, ``max_abs``);
- ``break-even``: the upload speed below which the compressed payload reaches the node sooner than the
  raw one, the trainer's extra CPU time included (bytes saved / extra seconds); none when it
  saves no bytes, "any" when it is made no slower.
- ``disk``: what the trainer writes each round for a restart, its payload plus its
  error-feedback state (``ErrorFeedback.to_bytes``), both written atomically and fsynced as
  ``tenzro trainer run`` writes them (in a temporary directory beside this script's working
  directory, so on the disk a trainer's state directory would use), over a raw task's trainer's
  one write of its raw payload: bytes and time.

Times are the best of ``--reps`` (the machine is noisy; the best is the least disturbed). There
is no target: the figures tell a sponsor what an encoding costs a trainer and a node.
docs/trainer.md "Compressed outer gradients" has what it does to training.

Usage::

    .venv/bin/python scripts/bench_compression.py
    .venv/bin/python scripts/bench_compression.py --params 65536 --densities 100 --q8-blocks 64,4096 --reps 3
    .venv/bin/python scripts/bench_compression.py --disk-dir /var/lib/tenzro   # the disk a trainer's state uses
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from tenzro_training.compression import ErrorFeedback, PayloadEncoding  # noqa: E402
from tenzro_training.fragments import compute_fragment_layouts  # noqa: E402
from storage.files import write_file_atomically  # noqa: E402
from tenzro_training.payload import (  # noqa: E402
    ENCODING_RAW,
    PayloadHeader,
    compute_max_payload_bytes,
    compute_q8_blocks,
    decode_payload,
    encode_payload,
    encode_q8_payload,
    encode_topk_payload,
)

MAX_ABS = 1e6  # the node's default max_gradient_abs


def best_of(reps: int, fn: Callable[[], object]) -> float:
    best = float("inf")
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--params", type=int, default=1 << 20, help="values in the fragment (default 2^20)")
    ap.add_argument("--densities", default="100,1000,5000", help="basis points, comma-separated (default 100,1000,5000)")
    ap.add_argument("--q8-blocks", default="256", help="q8 block sizes, comma-separated, '' for none (default 256)")
    ap.add_argument("--reps", type=int, default=7, help="repetitions, the best is kept (default 7)")
    ap.add_argument("--disk-dir", default=".", help="where the disk column writes (a temporary directory in it, "
                                                     "removed at the end; default: the current directory)")
    args = ap.parse_args(argv)
    encodings: list[PayloadEncoding] = []
    for flag, values, make in (("--densities", args.densities, lambda v: PayloadEncoding("topk", v)),
                               ("--q8-blocks", args.q8_blocks, lambda v: PayloadEncoding("q8", block_size=v))):
        try:
            encodings += [make(int(v)) for v in values.split(",") if v.strip()]
        except ValueError as exc:  # SpecError is a ValueError too
            ap.error(f"{flag}: {exc}")
    if args.params < 1 or args.reps < 1:
        ap.error("--params and --reps must be positive")
    if not Path(args.disk_dir).is_dir():
        ap.error(f"--disk-dir {args.disk_dir}: not a directory")

    disk = tempfile.TemporaryDirectory(prefix="bench-compression-", dir=args.disk_dir)
    try:
        return _measure(args, encodings, Path(disk.name))
    finally:
        disk.cleanup()


def _measure(args: argparse.Namespace, encodings: list[PayloadEncoding], disk: Path) -> int:
    layout = compute_fragment_layouts({"w": torch.zeros(args.params)}, 1)[0]
    gen = torch.Generator().manual_seed(0)
    grad = torch.randn(args.params, generator=gen) * 1e-3  # a real outer gradient's scale (dev example: ~8e-3 max)
    raw_header = PayloadHeader("bench", 0, 0, ENCODING_RAW, layout.layout_hash())
    raw = encode_payload(raw_header, layout, grad)
    raw_encode = best_of(args.reps, lambda: encode_payload(raw_header, layout, grad))
    limit = compute_max_payload_bytes(layout)
    raw_decode = best_of(args.reps, lambda: decode_payload(raw, layout, max_bytes=limit, zero_copy=True,
                                                           max_abs=MAX_ABS))
    raw_save = best_of(args.reps, lambda: write_file_atomically(disk / "raw.payload", raw, mode=0o600))
    print(f"fragment: {args.params:,} fp32 values; raw payload {len(raw):,} bytes, encode {raw_encode * 1e3:.2f} ms, "
          f"node decode {raw_decode * 1e3:.2f} ms, saved in {raw_save * 1e3:.2f} ms (the baselines)")
    rows = []
    for encoding in encodings:
        k = encoding.kept(args.params)
        header = PayloadHeader("bench", 0, 0, encoding.name, layout.layout_hash())
        feedback = ErrorFeedback([layout], encoding)

        def make() -> bytes:
            (first, second), = feedback.compress([grad], "float32")
            if encoding.block_size is not None:
                return encode_q8_payload(header, layout, first, second, encoding.block_size)
            return encode_topk_payload(header, layout, first, second)

        payload = make()
        trainer = best_of(args.reps, make)
        options = encoding.decode_options(layout)
        decode = best_of(args.reps, lambda: decode_payload(payload, layout, max_bytes=limit, zero_copy=True,
                                                           max_abs=MAX_ABS, **options))
        state = feedback.to_bytes({"round": "0"})

        def save() -> None:
            write_file_atomically(disk / "feedback.safetensors", feedback.to_bytes({"round": "0"}), mode=0o600)
            write_file_atomically(disk / "compressed.payload", payload, mode=0o600)

        saving = best_of(args.reps, save)
        row = {"encoding": encoding.describe(), "k": k, "bytes": len(payload), "bytes_ratio": round(len(payload) / len(raw), 4),
               "trainer_ms": round(trainer * 1e3, 2), "trainer_ratio": round(trainer / raw_encode, 2),
               "node_decode_ms": round(decode * 1e3, 2), "node_decode_ratio": round(decode / raw_decode, 2),
               "break_even_mbit_s": None, "disk_bytes": len(state) + len(payload),
               "disk_bytes_ratio": round((len(state) + len(payload)) / len(raw), 4),
               "disk_ms": round(saving * 1e3, 2), "disk_ratio": round(saving / raw_save, 2)}
        saved, extra = len(raw) - len(payload), trainer - raw_encode
        if saved > 0:
            # "any": smaller and made no slower than the raw payload
            row["break_even_mbit_s"] = round(saved * 8 / 1e6 / extra, 1) if extra > 0 else "any"
        even = row["break_even_mbit_s"]
        below = ("none: no bytes saved" if even is None else "any speed" if even == "any"
                 else f"{even:,} Mbit/s")
        rows.append(row)
        what = f"k {k:,}" if k is not None else f"{compute_q8_blocks(args.params, encoding.block_size):,} scales"  # type: ignore[arg-type]
        print(f"{encoding.describe():>9}: {what}; bytes {row['bytes_ratio']:.4f}x raw; trainer {row['trainer_ms']:.2f} ms "
              f"= {row['trainer_ratio']:.2f}x raw encode; node decode {row['node_decode_ms']:.2f} ms = "
              f"{row['node_decode_ratio']:.2f}x raw decode; break-even upload {below}; disk per round "
              f"{row['disk_bytes_ratio']:.4f}x raw bytes, {row['disk_ms']:.2f} ms = {row['disk_ratio']:.2f}x raw save")
    print(json.dumps({"compression": {"params": args.params, "raw_bytes": len(raw), "raw_encode_ms": round(raw_encode * 1e3, 2),
                                      "raw_decode_ms": round(raw_decode * 1e3, 2), "raw_save_ms": round(raw_save * 1e3, 2),
                                      "rows": rows}}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
