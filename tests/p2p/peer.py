"""A standalone gossip peer for transport tests and the benchmark: one OS process, one P2PHost.

Usage: python tests/p2p/peer.py --key KEYFILE [--listen MA] [--bootstrap MA ...] --mode pub|sub|relay
       [--run RUN_JSON] [--trainer-key HEX --outsider-key HEX]

Prints one JSON object per line on stdout (``{"event": ...}``) and reads JSON commands from stdin:

  {"cmd": "wait_peers", "topic": T, "count": N}        -> {"event": "peers", ...}
  {"cmd": "publish_raw", "count": N, "size": S}        N messages "raw:<i>:" padded to S bytes on RAW_TOPIC
  {"cmd": "publish_payload", "size": S, "kind": K}     one outer-gradient payload as signed PayloadChunks;
        K = good | unsigned | wrong_signer | malformed  (the last three must be rejected by validators)
  {"cmd": "stats"}                                     -> {"event": "stats", ...}
  {"cmd": "quit"}                                      clean stop (SIGINT / SIGTERM do the same)

Modes: ``sub`` and ``relay`` subscribe to both topics and install the real gossip validator on
TOPIC_TRAINING (``--rules node``: the node's rules; ``--rules trainer``: a trainer's) over the
RunState in ``--run`` (``RunState.to_dict`` JSON; the tests write the Training run of
tests.test_gossip.World, whose trainers hold real keys). ``pub`` signs payloads with
``--trainer-key`` (enrolled trainer 0 of that run) or, for ``wrong_signer``, ``--outsider-key``;
``sub`` also reports what it receives: {"event": "raw", "i": ...} and, for reassembled payloads,
{"event": "payload", "sha256": ..., "size": ...}. ``pub`` subscribes to nothing and validates nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from eth_account import Account  # noqa: E402

from tenzro_training import gossip as g  # noqa: E402
from tenzro_training.auth import SubmitOuterGradient, sign_message  # noqa: E402
from tenzro_training.errors import GossipReject  # noqa: E402
from tenzro_training.p2p import P2PConfig, P2PHost  # noqa: E402
from tenzro_training.run_state import RunState  # noqa: E402

RAW_TOPIC = "tenzro/test/raw"


def emit(event: str, **fields: object) -> None:
    sys.stdout.write(json.dumps({"event": event, "t": time.monotonic(), **fields}) + "\n")
    sys.stdout.flush()


def make_validator(run_path: str, chain_id: int, rules: str = "node") -> Callable[[bytes, str], None]:
    run = RunState.from_dict(json.loads(Path(run_path).read_text()))
    seen = g.SeenCache()
    if rules == "trainer":
        # What a trainer process holds: getRun's view of the run, not the RunState.
        from tenzro_training.gossip_trainer import TrainerGossipView, validate_gossip_as_trainer
        from tenzro_training.run_state import compute_run_view

        view = TrainerGossipView.from_run_view(compute_run_view(run, int(time.time() * 1000)), chain_id=chain_id,
                                               max_payload_bytes=64 << 20, max_model_bytes=64 << 20)

        def trainer_validator(data: bytes, from_peer: str) -> None:
            validate_gossip_as_trainer(g.TOPIC_TRAINING, data, view, seen)

        return trainer_validator

    def validator(data: bytes, from_peer: str) -> None:
        ctx = g.GossipContext(get_run=lambda task: run if task == run.task_id else None, chain_id=chain_id,
                              now_ms=int(time.time() * 1000))
        g.validate_gossip(g.TOPIC_TRAINING, data, ctx, seen)

    return validator


def payload_messages(args: argparse.Namespace, size: int, kind: str) -> list[bytes]:
    """Chunks of one outer-gradient payload for round 0, fragment 0 of the run's first trainer."""
    payload = os.urandom(size)
    if kind == "malformed":
        return [b"\x01\x01" + os.urandom(64), b"\x63garbage", b""]
    trainer_key = bytes.fromhex(args.trainer_key)
    trainer = bytes.fromhex(Account.from_key(trainer_key).address[2:])
    digest = hashlib.sha256(payload).digest()
    signed = SubmitOuterGradient(args.task_id, 0, 0, digest)
    if kind == "unsigned":
        signature = b"\0" * 65
    else:
        signer = bytes.fromhex(args.outsider_key) if kind == "wrong_signer" else trainer_key
        signature = sign_message(signed, signer, args.chain_id)
    chunks = g.compute_payload_chunks(task_id=args.task_id, round=0, fragment=0, trainer=trainer,
                                      signature=signature, payload=payload)
    return [g.encode_message(c) for c in chunks]


async def consume(topic: str, queue: asyncio.Queue, report: bool) -> None:
    assembler = g.ChunkAssembler(max_total_bytes=256 << 20, max_pending=16)
    while True:
        msg = await queue.get()
        if not report:
            continue
        if topic == RAW_TOPIC:
            emit("raw", i=int(msg.data.split(b":")[1]), size=len(msg.data))
            continue
        try:
            chunk = g.decode_message(msg.data)
            whole = assembler.add(chunk) if isinstance(chunk, g.PayloadChunk) else None
        except GossipReject as exc:  # cannot happen behind the validator; reported if it does
            emit("bad", reason=str(exc))
            continue
        if whole is not None:
            # The assembler checked the bytes against payload_hash; hashing them again here would
            # add ~9 ms per 16 MiB to the throughput benchmark's clock.
            emit("payload", sha256=chunk.payload_hash.hex(), size=len(whole))


async def handle(host: P2PHost, cmd: dict, args: argparse.Namespace) -> bool:
    name = cmd.get("cmd")
    if name == "quit":
        return False
    if name == "stats":
        emit("stats", **host.stats(), peers=len(host.connected_peers()))
    elif name == "wait_peers":
        await host.wait_for_peers(cmd["topic"], cmd.get("count", 1), cmd.get("timeout", 20.0))
        emit("peers", topic=cmd["topic"])
    elif name == "publish_raw":
        size = cmd.get("size", 16)
        for i in range(cmd["count"]):
            data = b"raw:%d:" % i
            await host.publish(RAW_TOPIC, data + b"\0" * max(0, size - len(data)))
        emit("published", count=cmd["count"])
    elif name == "publish_payload":
        messages = payload_messages(args, cmd["size"], cmd.get("kind", "good"))
        emit("publishing", count=len(messages))  # its "t" starts the clock of a throughput measurement
        start = time.perf_counter()
        for data in messages:
            await host.publish(g.TOPIC_TRAINING, data)
        emit("published", count=len(messages), seconds=time.perf_counter() - start)
    else:
        emit("error", reason=f"unknown command {name!r}")
    return True


async def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--key", required=True)
    p.add_argument("--listen", default="/ip4/127.0.0.1/tcp/0")
    p.add_argument("--bootstrap", action="append", default=[])
    p.add_argument("--rules", choices=("node", "trainer"), default="node",
                   help="validator rule set on TOPIC_TRAINING: the node's (RunState) or a trainer's (getRun view)")
    p.add_argument("--redial-interval", type=float, default=5.0, help="P2PConfig.redial_interval_s")
    p.add_argument("--mode", choices=("pub", "sub", "relay"), required=True)
    p.add_argument("--run", help="RunState JSON the validator checks against (sub/relay)")
    p.add_argument("--task-id", default="run-test")
    p.add_argument("--chain-id", type=int, default=1337)
    p.add_argument("--trainer-key", help="hex secp256k1 key of an enrolled trainer (pub)")
    p.add_argument("--outsider-key", help="hex secp256k1 key of a non-enrolled account (pub)")
    args = p.parse_args()

    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)

    host = P2PHost(P2PConfig(key_path=Path(args.key), listen=(args.listen,), bootstrap=tuple(args.bootstrap),
                             redial_interval_s=args.redial_interval))
    tasks: list[asyncio.Task] = []
    try:
        if args.mode != "pub":
            host.set_validator(g.TOPIC_TRAINING, make_validator(args.run, args.chain_id, args.rules))
        await host.start()
        if args.mode != "pub":
            for topic in (RAW_TOPIC, g.TOPIC_TRAINING):
                queue = await host.subscribe(topic)
                tasks.append(asyncio.create_task(consume(topic, queue, report=args.mode == "sub")))
        emit("ready", peer_id=host.peer_id, addrs=list(host.addrs), peers=len(host.connected_peers()))

        reader = asyncio.StreamReader()
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
        stop_wait = asyncio.create_task(stop.wait())
        while True:
            line_task = asyncio.create_task(reader.readline())
            done, _ = await asyncio.wait({line_task, stop_wait}, return_when=asyncio.FIRST_COMPLETED)
            if stop_wait in done:
                line_task.cancel()
                break
            line = line_task.result()
            if not line:
                break
            if not await handle(host, json.loads(line), args):
                break
    finally:
        for t in tasks:
            t.cancel()
        await host.stop()
        emit("stopped", **host.stats())
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
