"""Benchmark how a node's per-round cost grows over a long run, against its own first rounds.

A node's cost per round should not depend on how many rounds came before: up to schema version
3 every transition rewrote the run's whole stored value, round records included, so a 600-round
run wrote 1.19 GB of log and its submissions ran 10x slower by the end (soak probe, 2026-11-26).

In process, on RocksDB (what ``tenzro node`` runs): one run of a tiny model (M = K = 3 trainers,
F = 2 fragments) driven through ``--rounds`` rounds (3 x 2 inline submissions, then
finalizeRound, each signed). The baseline is the same run's first ``--window`` rounds, measured
in the same process: the ratio is the mean seconds per round over the last ``--window`` rounds
before the sealing one to that over the first (target <= 1.5x), with the bytes the store wrote
per round (the RocksDB directory's growth, log included) early and late, and the size of the
run's stored value. The sealing round is timed apart: it builds the run root and the receipt,
whose size is proportional to the rounds by design. Another process busy on the machine while
the run goes on makes its later rounds look slower: run it on an idle machine. Once the run
sealed, a node is started again on the store and the Python memory it holds is measured
(tracemalloc), with the start's time: right after the start (an ended run is its stored summary
alone) and once a getRun read the run back into the cache of ended runs (one of the
``ENDED_RUNS_CACHED`` last used). Every run ever held used to stay decoded in memory, and every
start decoded it.

Usage::

    .venv/bin/python scripts/bench_long_run.py                 # 400 rounds, ~1 min on 2 cores
    .venv/bin/python scripts/bench_long_run.py --rounds 120 --window 20
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_rpc import Bench  # noqa: E402

from tenzro_training import auth  # noqa: E402

MODEL = {"context_len": 32, "horizon": 8, "patch_len": 8, "d_model": 8, "n_layers": 1, "n_heads": 2, "d_ff": 16}
TRAINERS = 3
FRAGMENTS = 2


def _dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def run(rounds: int, window: int, workdir: Path) -> dict[str, float]:
    from storage import schema
    from tenzro_training.cli.layouts import compute_layouts_from_view
    from tenzro_training.spec import TrainingTaskSpec

    bench = Bench(workdir, store="rocksdb")
    try:
        task_id = "bench-long-run"
        spec = bench.spec(task_id, MODEL, FRAGMENTS, "CoordinateMedian", rounds)
        spec.update(trainer_count=TRAINERS, quorum=TRAINERS)
        svc = bench.service
        parsed = TrainingTaskSpec.from_dict(spec)
        svc.post_task(spec, bench.sign(auth.PostTask(task_id=task_id, spec_hash=parsed.spec_hash()), "sponsor:0"))
        bench.clock.now += 20
        svc.tick()
        trainers = [f"trainer:{i}" for i in range(TRAINERS)]
        for i, who in enumerate(trainers):
            did = f"did:tenzro:trainer:bench-{i}"
            msg = auth.EnrollTrainer(task_id=task_id, did=did, trainer=bytes.fromhex(bench.address(who)[2:]), stake=10**18)
            svc.enroll_trainer(task_id, did, bench.address(who), 10**18, bench.sign(msg, who))
        layouts = compute_layouts_from_view(svc.get_run(task_id))
        per_round: list[float] = []
        sizes: list[int] = []
        for round_ in range(rounds):
            # Payloads and signatures are the trainers' work: made before the clock starts.
            calls = []
            for who in trainers:
                for lay in layouts:
                    payload = bench.payload(task_id, lay, round_, who)
                    calls.append((lay.index, payload, bench.submit_signature(task_id, round_, lay.index, payload, who)))
            finalize_sig = bench.sign(auth.FinalizeRound(task_id=task_id, round=round_), bench.syncer(task_id))
            t0 = time.perf_counter()
            for fragment, payload, sig in calls:
                svc.submit_outer_gradient(task_id, round_, fragment, payload, None, sig)
            svc.finalize_round(task_id, round_, finalize_sig)
            per_round.append(time.perf_counter() - t0)
            sizes.append(_dir_bytes(workdir / "db"))
        assert svc.get_run(task_id)["status"] == "Sealed"
        value = bench.store.get(schema.CF_TRAINING_RUNS, schema.run_key(task_id)) or b""
        svc.close()
        held = {cached: _held_bytes(bench, task_id, cached) for cached in (True, False)}
        plain, seal = per_round[:-1], per_round[-1]
        early = sum(plain[:window]) / window
        late = sum(plain[-window:]) / window
        return {
            "early_s": early, "late_s": late, "ratio": late / early, "seal_s": seal,
            "early_bytes": (sizes[window - 1] - sizes[0]) / (window - 1),
            "late_bytes": (sizes[-2] - sizes[-window]) / (window - 1),
            "db_bytes": sizes[-1], "value_bytes": len(value),
            "held_cached": held[True][0], "held_evicted": held[False][0], "start_s": held[False][1],
        }
    finally:
        bench.close()


def _held_bytes(bench: Bench, task_id: str, cached: bool) -> tuple[int, float]:
    """Python memory a node started on the bench's store holds, and the seconds its start took:
    right after the start (the ended run is a summary), or once a call named the run (read back
    into the cache of ended runs, as a getRun does)."""
    from tenzro_training.node.service import NodeService

    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        t0 = time.perf_counter()
        node = NodeService(bench.config, bench.store, clock=bench.clock)
        seconds = time.perf_counter() - t0
        if cached:
            node.get_run(task_id)
        held = tracemalloc.get_traced_memory()[0] - base
        assert (node.get_run_state(task_id) is not None) is cached
        node.close()
        return held, seconds
    finally:
        tracemalloc.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=400)
    parser.add_argument("--window", type=int, default=25, help="rounds averaged at each end")
    args = parser.parse_args(argv)
    if not 2 <= args.window <= (args.rounds - 1) // 2:
        parser.error("--window must be in 2..(rounds-1)/2")
    print(f"load average before: {os.getloadavg()[0]:.2f}  cpus: {os.cpu_count()}", flush=True)
    with tempfile.TemporaryDirectory(prefix="bench-long-run-") as tmp:
        r = run(args.rounds, args.window, Path(tmp))
    ok = r["ratio"] <= 1.5
    print(f"long run, RocksDB, M=K={TRAINERS}, F={FRAGMENTS}, {args.rounds} rounds (6 submissions + finalize each):")
    print(f"  seconds per round   first {args.window}: {r['early_s'] * 1000:8.2f} ms   last {args.window}: "
          f"{r['late_s'] * 1000:8.2f} ms   last/first {r['ratio']:5.2f}x  <= 1.50x {'ok' if ok else 'MISSED'}")
    print(f"  sealing round       {r['seal_s'] * 1000:8.2f} ms (run root and receipt over all {args.rounds} rounds)")
    print(f"  store growth/round  first {args.window}: {r['early_bytes'] / 1024:8.1f} KiB  last {args.window}: "
          f"{r['late_bytes'] / 1024:8.1f} KiB  (RocksDB directory, log included; flushes make it jumpy)")
    print(f"  store at the end    {r['db_bytes'] / 2**20:.1f} MiB; the run's value in training_runs "
          f"{r['value_bytes']} bytes (round records are under their own keys)")
    print(f"  node memory, sealed run   {r['held_evicted'] / 1024:8.1f} KiB right after a start "
          f"({r['start_s'] * 1000:.1f} ms, tracemalloc on), {r['held_cached'] / 1024:8.1f} KiB once a getRun read it "
          f"back (one of the last ended runs used)")
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
