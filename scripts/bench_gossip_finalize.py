"""Benchmark: time from a round's finalize to the LAST of N trainers holding the new global model.

Real libp2p in one process: one publisher host plays the node's gossip bridge, N trainer hosts
bootstrap from it (a star, as in a small run). After "finalize" (the new weights and their hash
exist) the publisher sends the RoundFinalizedMsg chunks exactly as ``node/gossip_bridge.py`` does;
each trainer reassembles them (``gossip.ChunkAssembler``), splits the weights by the fragment
layouts and checks ``global_model.compute_state_model_hash`` against the model hash, as
``trainer/process.py`` does. Reported: per-trainer and last-trainer latency, over a few rounds.

It measures from the start of publishing (the bridge publishes right after the finalize batch
committed), so the aggregation itself is not included (see bench_rpc for finalizeRound).

    .venv/bin/python scripts/bench_gossip_finalize.py [--trainers 8] [--params 1000000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import logging
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tenzro_training import auth, gossip as g  # noqa: E402
from tenzro_training.global_model import compute_initial_model, compute_state_model_hash  # noqa: E402
from tenzro_training.node.gossip_bridge import compute_weights_bytes  # noqa: E402
from tenzro_training.p2p.host import P2PConfig, P2PHost  # noqa: E402
from tenzro_training.trainer.process import decode_fragment_weights  # noqa: E402


async def bench_finalize_to_trainers(trainers: int, params: int, rounds: int, fragments: int = 4) -> list[float]:
    """Seconds from publish start to the last trainer holding the verified model, per round."""
    side = max(1, int(params**0.5))
    state = {"w": torch.randn(side, side), "b": torch.randn(params - side * side if params > side * side else 1)}
    model = compute_initial_model(state, fragments)
    syncer_key = bytes(range(1, 33))
    from eth_account import Account

    syncer = bytes.fromhex(Account.from_key(syncer_key).address[2:])
    work = Path(tempfile.mkdtemp(prefix="bench-gossip-"))
    node = P2PHost(P2PConfig(key_path=work / "node.key"))
    await node.start()
    hosts: list[P2PHost] = []
    results: list[float] = []
    try:
        await node.subscribe(g.TOPIC_SYNCER)
        done: list[asyncio.Queue[tuple[int, float]]] = []
        tasks = []
        for i in range(trainers):
            host = P2PHost(P2PConfig(key_path=work / f"t{i}.key", bootstrap=(node.addrs[0],)))
            await host.start()
            hosts.append(host)
            q = await host.subscribe(g.TOPIC_SYNCER)
            out: asyncio.Queue[tuple[int, float]] = asyncio.Queue()
            done.append(out)
            tasks.append(asyncio.create_task(_trainer(q, out, model, params * 8 + 1024)))
        await node.wait_for_peers(g.TOPIC_SYNCER, trainers, timeout=60)
        weights = list(model.weights)
        for r in range(rounds):
            weights = [w + 0.001 for w in weights]  # "the finalize": new weights, new hash
            model_hash = compute_state_model_hash(model.model, weights)
            sig = auth.sign_message(auth.FinalizeRound(task_id="bench", round=r), syncer_key, auth.DEFAULT_CHAIN_ID)
            t0 = time.perf_counter()
            data = compute_weights_bytes(weights)
            for chunk in g.compute_round_finalized_chunks(
                task_id="bench", round=r, syncer=syncer, syncer_signature=sig,
                aggregate_hashes=tuple(hashlib.sha256(b"%d" % f).digest() for f in range(fragments)),
                model_hash=model_hash, weights=data,
            ):
                await node.publish(g.TOPIC_SYNCER, g.encode_message(chunk))
            lat = []
            for out in done:
                got_round, at = await asyncio.wait_for(out.get(), 120)
                assert got_round == r
                lat.append(at - t0)
            results.append(max(lat))
            print(f"round {r}: {len(data) / 1e6:.1f} MB of weights; trainers verified after "
                  f"p50 {statistics.median(lat) * 1000:.0f} ms, last {max(lat) * 1000:.0f} ms", flush=True)
        for t in tasks:
            t.cancel()
    finally:
        for host in hosts:
            await host.stop()
        await node.stop()
        shutil.rmtree(work, ignore_errors=True)  # the 9 peer keys
    return results


async def _trainer(queue: asyncio.Queue, out: asyncio.Queue, model: object, max_bytes: int) -> None:
    assembler = g.ChunkAssembler(max_total_bytes=max_bytes, max_pending=4)
    layouts = model.model.layouts  # type: ignore[attr-defined]
    while True:
        item = await queue.get()
        msg = g.decode_message(item.data)
        whole = assembler.add(msg)
        if whole is None:
            continue
        weights = await asyncio.to_thread(decode_fragment_weights, whole, layouts)
        got = await asyncio.to_thread(compute_state_model_hash, model.model, weights)  # type: ignore[attr-defined]
        if got != msg.model_hash:
            raise SystemExit("model hash mismatch")
        out.put_nowait((msg.round, time.perf_counter()))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trainers", type=int, default=8)
    ap.add_argument("--params", type=int, default=1_000_000)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("libp2p").setLevel(logging.WARNING)
    res = asyncio.run(bench_finalize_to_trainers(args.trainers, args.params, args.rounds))
    print(f"finalize -> last of {args.trainers} trainers holding the verified model: "
          f"median {statistics.median(res) * 1000:.0f} ms over {len(res)} rounds ({args.params} params)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
