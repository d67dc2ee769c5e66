"""Gossip payload throughput, one peer process to another, against a raw TCP transfer on loopback.

For each payload size (1 MiB and 16 MiB) a publisher process (tests/p2p/peer.py --mode pub) sends
one outer-gradient payload as signed PayloadChunks; a subscriber process validates every chunk
(real gossip rules, EIP-712 signature), reassembles and hash-checks it. Time = from the publisher's
"publishing" event to the subscriber's "payload" event (both CLOCK_MONOTONIC, system-wide on Linux).
The baseline is the same number of bytes through a plain TCP socket on 127.0.0.1 in this run.
Target: gossip >= 0.3x raw TCP for 16 MiB. Also measured in the same run: one bare py-libp2p
stream between two processes (TCP + Noise + yamux, no pubsub): the ceiling of ANY protocol on
this libp2p stack, so the gap between gossip and raw TCP splits into "the stack" and "gossipsub".

Usage: .venv/bin/python scripts/bench_gossip.py [--repeat N]

Hook for more measurements (e.g. "finalize to 8 trainers holding the new model"): append a
function ``fn(tmp: Path) -> dict`` to ``EXTRA_MEASUREMENTS``; main() runs each after the payload
benchmark and prints its dict as one JSON line. ``spawn_peers`` and ``Peer`` are reusable.
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.p2p.test_transport import Peer  # noqa: E402  (spawns tests/p2p/peer.py, reads its JSON events)

SIZES = (1 << 20, 16 << 20)
TOPIC = "tenzro/training/1.0.0"

def finalize_to_8_trainers(tmp: Path) -> dict:
    """Time from the node publishing RoundFinalized (1M-parameter model, chunked weights) to the
    last of 8 trainers holding the new global model with its hash verified."""
    import asyncio
    import statistics

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_gossip_finalize import bench_finalize_to_trainers

    times = asyncio.run(bench_finalize_to_trainers(8, 1_000_000, 3))
    return {"trainers": 8, "params": 1_000_000, "median_ms": round(statistics.median(times) * 1000),
            "rounds": len(times)}


EXTRA_MEASUREMENTS: list[Callable[[Path], dict]] = [finalize_to_8_trainers]
"""More measurements to run after the payload benchmark."""


def spawn_peers(tmp: Path) -> tuple[Peer, Peer]:
    """A validating subscriber and a publisher connected to it, with the topic mesh formed."""
    sub = Peer(tmp, "sub", "sub")
    pub = Peer(tmp, "pub", "pub", (sub.addr,))
    pub.send(cmd="wait_peers", topic=TOPIC, count=1)
    pub.expect("peers")
    return sub, pub


def measure_gossip(sub: Peer, pub: Peer, size: int) -> float:
    """Seconds from the first publish to the verified, reassembled payload at the subscriber."""
    pub.send(cmd="publish_payload", size=size, kind="good")
    start = pub.expect("publishing")["t"]
    done = sub.expect("payload", lambda e: e["size"] == size)
    pub.expect("published")
    return done["t"] - start


def measure_raw_tcp(size: int) -> float:
    """Seconds to push ``size`` bytes through a loopback TCP socket to a reader that consumes them."""
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    finished = threading.Event()
    result: list[float] = []

    def reader() -> None:
        conn, _ = server.accept()
        got = 0
        while got < size:
            chunk = conn.recv(1 << 20)
            if not chunk:
                break
            got += len(chunk)
        result.append(time.monotonic())
        conn.close()
        finished.set()

    threading.Thread(target=reader, daemon=True).start()
    data = b"\xab" * size
    client = socket.create_connection(("127.0.0.1", port))
    start = time.monotonic()
    client.sendall(data)
    finished.wait(60)
    client.close()
    server.close()
    return result[0] - start


_STREAM_PROTOCOL = "/tenzro/bench/stream/1.0.0"


def _stream_receiver(conn: Any, size: int, repeat: int) -> None:
    """Child process: a bare py-libp2p host that reads ``repeat`` streams of ``size`` bytes and
    reports each one's completion time (CLOCK_MONOTONIC) through ``conn``."""
    import multiaddr
    import trio
    from libp2p import new_host
    from libp2p.crypto import secp256k1

    async def run() -> None:
        host = new_host(key_pair=secp256k1.create_new_key_pair())
        done = trio.Event()
        count = 0

        async def handler(stream: Any) -> None:
            nonlocal count
            got = 0
            while got < size:
                data = await stream.read(1 << 20)
                if not data:
                    break
                got += len(data)
            conn.send(("read", got, time.monotonic()))
            await stream.close()
            count += 1
            if count == repeat:
                done.set()

        async with host.run(listen_addrs=[multiaddr.Multiaddr("/ip4/127.0.0.1/tcp/0")]):
            host.set_stream_handler(_STREAM_PROTOCOL, handler)
            conn.send(("addr", str(host.get_addrs()[0])))
            with trio.move_on_after(120):
                await done.wait()

    trio.run(run)


def measure_libp2p_stream(size: int, repeat: int) -> float:
    """Median seconds to push ``size`` bytes through ONE py-libp2p stream (TCP + Noise + yamux,
    no pubsub, no signatures) between two processes: the ceiling any protocol on this libp2p
    stack shares, measured beside gossip and raw TCP."""
    import multiprocessing as mp

    import multiaddr
    import trio
    from libp2p import new_host
    from libp2p.crypto import secp256k1
    from libp2p.peer.peerinfo import info_from_p2p_addr

    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_stream_receiver, args=(child, size, repeat), daemon=True)
    proc.start()
    times: list[float] = []
    try:
        kind, addr = parent.recv()
        assert kind == "addr"

        async def run() -> None:
            host = new_host(key_pair=secp256k1.create_new_key_pair())
            data = b"\xab" * size
            async with host.run(listen_addrs=[multiaddr.Multiaddr("/ip4/127.0.0.1/tcp/0")]):
                info = info_from_p2p_addr(multiaddr.Multiaddr(addr))
                await host.connect(info)
                for _ in range(repeat):
                    stream = await host.new_stream(info.peer_id, [_STREAM_PROTOCOL])
                    start = time.monotonic()
                    for i in range(0, size, 1 << 20):
                        await stream.write(data[i : i + (1 << 20)])
                    _, got, end = await trio.to_thread.run_sync(parent.recv)
                    if got != size:
                        raise RuntimeError(f"libp2p stream delivered {got} of {size} bytes")
                    times.append(end - start)
                    await stream.close()

        trio.run(run)
    finally:
        proc.join(10)
        if proc.is_alive():
            proc.kill()
    return statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        sub, pub = spawn_peers(tmp)
        ok = True
        try:
            for size in SIZES:
                gossip = statistics.median(measure_gossip(sub, pub, size) for _ in range(args.repeat))
                raw = statistics.median(measure_raw_tcp(size) for _ in range(args.repeat))
                stream = measure_libp2p_stream(size, args.repeat)
                mib = size / (1 << 20)
                ratio = raw / gossip
                ok &= size != 16 << 20 or ratio >= 0.3
                print(json.dumps({
                    "measurement": "payload_throughput",
                    "size_mib": mib,
                    "gossip_s": round(gossip, 4),
                    "gossip_mib_s": round(mib / gossip, 1),
                    "raw_tcp_s": round(raw, 4),
                    "raw_tcp_mib_s": round(mib / raw, 1),
                    "ratio": round(ratio, 4),
                    "libp2p_stream_mib_s": round(mib / stream, 1),
                    "libp2p_stream_ratio": round(raw / stream, 4),
                    "gossip_vs_libp2p_stream": round(stream / gossip, 3),
                    "target": ">= 0.3x raw TCP" if size == 16 << 20 else None,
                    "met": ratio >= 0.3 if size == 16 << 20 else None,
                }), flush=True)
            stats = sub.stats()
            print(json.dumps({"measurement": "subscriber_stats", **{k: stats[k] for k in (
                "delivered", "rejected", "ignored", "dropped")}}), flush=True)
        finally:
            pub.quit()
            sub.quit()
        for fn in EXTRA_MEASUREMENTS:
            print(json.dumps({"measurement": fn.__name__, **fn(tmp)}), flush=True)
    return 0 if ok else 1  # as bench_rpc.py: non-zero when a target is missed


if __name__ == "__main__":
    sys.exit(main())
