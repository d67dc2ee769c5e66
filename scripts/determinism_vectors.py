"""Print, write or check the determinism test vectors (tests/test_determinism_vectors.py) on
this machine, at several torch thread counts: what a third party runs to see that its machine
recomputes a node's aggregates, outer steps and model hashes bit for bit.

Usage::

    .venv/bin/python scripts/determinism_vectors.py                      # check tests/vectors/determinism.json
    .venv/bin/python scripts/determinism_vectors.py --threads 1,2,16     # at each of these thread counts
    .venv/bin/python scripts/determinism_vectors.py --write              # rewrite the file (a deliberate change only)

Exit status: 0 when every vector matches at every thread count, 1 otherwise (each mismatch is
named), 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from tests.test_determinism_vectors import VECTORS, compute_vectors  # noqa: E402
from tests.vectors.inputs import make_vector  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", default=None, help="comma-separated torch thread counts (default: the current one)")
    parser.add_argument("--write", action="store_true", help=f"write {VECTORS.relative_to(ROOT)} from this machine")
    args = parser.parse_args(argv)
    try:
        counts = [int(c) for c in args.threads.split(",")] if args.threads else [torch.get_num_threads()]
    except ValueError:
        parser.error("--threads takes comma-separated integers")
    if any(c < 1 for c in counts):
        parser.error("--threads takes counts >= 1")
    machine = f"{platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}, numpy {__import__('numpy').__version__}"
    print(f"machine: {machine}")
    results = {}
    for count in counts:
        torch.set_num_threads(count)
        results[count] = compute_vectors()
        print(f"  {count:3d} torch thread(s): {len(results[count])} vectors computed")
    first = results[counts[0]]
    if args.write:
        sample = make_vector("grad/4099/3", 4099).astype("<f4").tobytes()
        inputs = {"inputs/grad/4099/3": hashlib.sha256(sample).hexdigest()}
        doc = {"written_on": machine, "vectors": dict(sorted({**first, **inputs}.items()))}
        VECTORS.parent.mkdir(parents=True, exist_ok=True)
        VECTORS.write_text(json.dumps(doc, indent=1) + "\n")
        print(f"wrote {VECTORS.relative_to(ROOT)}")
    expected = {k: v for k, v in json.loads(VECTORS.read_text())["vectors"].items() if not k.startswith("inputs/")}
    bad = 0
    for count, got in results.items():
        wrong = sorted(k for k in expected.keys() | got.keys() if got.get(k) != expected.get(k))
        for name in wrong:
            print(f"  MISMATCH at {count} thread(s): {name}: {got.get(name)} != {expected.get(name)}")
        bad += len(wrong)
    print(json.dumps({"determinism": {"machine": machine, "threads": counts, "vectors": len(expected),
                                      "mismatches": bad}}))
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
