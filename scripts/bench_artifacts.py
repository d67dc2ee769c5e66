"""Benchmark the node's run-artifact downloads (``GET /artifacts/v1``, docs/rpc.md "Run artifacts
over HTTP") against a bare aiohttp floor, and what they cost the JSON-RPC path, in ONE run.

Why: a node now serves every committed round's payloads (~1 MiB each, M x F per round) and a
sealed run's model on its RPC port, to anyone recomputing a run (``tenzro train verify-run``).
An operator asks two things: how fast can clients pull them, and does pulling them starve the
trainers' and syncers' JSON-RPC calls, which share the port, the event loop and the ONE service
thread (each payload GET reads the store there; the SHA-256 of each answer runs on the
artifact module's own threads, under the same GIL).

Setup, in the server's child process (``bench_rpc.Bench``: a ``NodeService`` with the dev
accounts): a run of 8 trainers x 4 fragments (``bench_rpc.SUBMIT_MODEL``: ~1.03 MiB payloads,
a ~4 MiB model), every trainer submits every fragment of round 0, the syncer finalizes it, and
as the run has one round it seals: round 0 is committed (its 32 accepted payloads are public)
and the final model exists. Served by ``rpc.server.start_server(..., serve_artifacts=True)``
with the node's limits on one service-executor thread, as ``tenzro node`` does, on the store(s)
``--store`` names (default both: RocksDB is what a node runs; the memory store isolates the
rest). The bench's node has no data_dir, so the model is built from the stored final weights
per GET (``export_final_model`` on the service thread), the path of a node whose model file is
missing; a node with its file streams it from disk instead.

1. Download throughput on loopback, server and client in separate processes (2 cores: one
   each). Baseline: a bare aiohttp handler answering the same URL paths with the same bytes
   from memory (``application/octet-stream``, the same hash header): no run lookup, no store
   read, no SHA-256, no byte budget, no chunked write. ``--requests`` payload GETs (each of the
   32 payloads in turn) and ``--model-requests`` model GETs, ``--concurrency`` connections,
   sent to both servers (both running) in alternating blocks (``--blocks``) so the machine's
   drift hits both alike; req/s, MiB/s and ours/raw. The client checks every answer (status
   200, the body's SHA-256 equal to the expected bytes', the hash header equal to the expected
   one: a payload's SHA-256, the model's ``final_model_hash`` from the receipt), so an error
   answer cannot pass for a fast download; that check costs the client the same for both.
2. getRun latency under artifact load: ``--latency-calls`` sequential getRun calls from one
   connection (p50, p99) with no download running vs while ``--pullers`` connections pull
   payloads continuously from a third process (which checks every body too), in alternating
   blocks. On 2 cores that puller competes with the server for CPU, as the client of part 1
   does, so the loaded figures are pessimistic for a node whose downloaders are remote.

No target: the figures are informational (``target: none``). Exit 1 when a check fails (an
answer that is not the expected artifact) or anything raises; else 0.

Usage::

    .venv/bin/python scripts/bench_artifacts.py                  # both stores, ~30 s on 2 cores
    .venv/bin/python scripts/bench_artifacts.py --store rocksdb --requests 1280 --pullers 8

Wall times on a shared machine are noisy; the load average is printed with the results.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import math
import multiprocessing as mp
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_rpc  # noqa: E402
from bench_rpc import SUBMIT_FRAGMENTS, SUBMIT_MODEL, TRAINERS, Bench, Server  # noqa: E402

from tenzro_training import auth  # noqa: E402

TASK_ID = "bench-artifacts"
MODEL_PATH = f"/artifacts/v1/runs/{TASK_ID}/model"

Item = tuple[str, str, str, str]
"""One download: (URL path, SHA-256 of the body as hex, hash header name, its expected value)."""


class CheckFailed(RuntimeError):
    """An answer that is not the expected artifact: the bench measured an error."""


# --- servers (child processes) --------------------------------------------------------------------


def _prepare(workdir: Path, store: str) -> tuple[Bench, dict[str, Any]]:
    """A sealed one-round run whose round 0 accepted every trainer's every fragment; its payloads
    and model written to files (for the raw server), with what the client checks."""
    started = time.perf_counter()
    bench = Bench(workdir, store=store)
    svc = bench.service
    layouts = bench.start_run(bench.spec(TASK_ID, SUBMIT_MODEL, SUBMIT_FRAGMENTS, "Mean", 1))
    payloads: list[Item] = []
    files: dict[str, str] = {}
    for i in range(TRAINERS):
        who = f"trainer:{i}"
        for lay in layouts:
            payload = bench.payload(TASK_ID, lay, 0, who)
            sig = bench.submit_signature(TASK_ID, 0, lay.index, payload, who)
            svc.submit_outer_gradient(TASK_ID, 0, lay.index, payload, None, sig)
            path = f"/artifacts/v1/runs/{TASK_ID}/payloads/0/{lay.index}/{bench.address(who)}"
            digest = hashlib.sha256(payload).hexdigest()
            payloads.append((path, digest, "X-Tenzro-Payload-Hash", "0x" + digest))
            files[path] = str(workdir / f"payload-{len(files)}.bin")
            Path(files[path]).write_bytes(payload)
    svc.finalize_round(TASK_ID, 0, bench.sign(auth.FinalizeRound(task_id=TASK_ID, round=0), bench.syncer(TASK_ID)))
    view = svc.get_run(TASK_ID)
    if view["status"] != "Sealed" or len(view["round_records"]) != 1:
        raise RuntimeError(f"setup: the run is {view['status']} with {len(view['round_records'])} round records")
    model = svc.export_final_model(TASK_ID)
    files[MODEL_PATH] = str(workdir / "model.safetensors")
    Path(files[MODEL_PATH]).write_bytes(model)
    final_hash = svc.get_receipt(TASK_ID)["receipt"]["final_model_hash"]
    info = {
        "payloads": payloads,
        "model": (MODEL_PATH, hashlib.sha256(model).hexdigest(), "X-Tenzro-Model-Hash", final_hash),
        "files": files,
        "payload_bytes": len(Path(files[payloads[0][0]]).read_bytes()),
        "model_bytes": len(model),
        "get_body": bench_rpc._request("tenzro_training_getRun", {"task_id": TASK_ID}, 1).decode(),
        "setup_s": time.perf_counter() - started,
    }
    return bench, info


def _serve(kind: str, conn: Any, workdir: str, _unused: int, canned: dict[str, Any] | None, store: str) -> None:
    """Child process (``bench_rpc.Server``'s target): build the server, send (port, info), serve
    until told to stop. ``ours``: the node's server with artifacts; ``raw``: the files of
    ``canned`` (ours' info) from memory at the same paths."""

    async def serve(stop: asyncio.Event) -> None:
        from aiohttp import web

        if kind == "ours":
            bench, info = _prepare(Path(workdir), store)
            await bench_rpc.serve_bench(conn, stop, bench, info, limits=bench.config.server_limits(),
                                        serve_artifacts=True)
            return
        assert canned is not None
        answers: dict[str, tuple[bytes, dict[str, str]]] = {}
        for path, _digest, header, value in [*canned["payloads"], canned["model"]]:
            answers[path] = (Path(canned["files"][path]).read_bytes(), {header: value})

        async def handle(request: web.Request) -> web.Response:
            body, headers = answers[request.path]
            return web.Response(body=body, headers=headers, content_type="application/octet-stream")

        app = web.Application()
        app.router.add_get(f"/artifacts/v1/runs/{TASK_ID}/payloads/{{round}}/{{fragment}}/{{trainer}}", handle)
        app.router.add_get(MODEL_PATH, handle)
        await bench_rpc.serve_app(conn, stop, app)

    bench_rpc.run_child_server(conn, serve)


# --- client ------------------------------------------------------------------------------------------


def _check(item: Item, status: int, headers: Any, body: bytes) -> None:
    path, digest, header, value = item
    if status != 200:
        raise CheckFailed(f"GET {path}: HTTP {status}: {body[:200]!r}")
    got = hashlib.sha256(body).hexdigest()
    if got != digest:
        raise CheckFailed(f"GET {path}: {len(body)} bytes hashing to {got}, expected {digest}")
    if headers.get(header) != value:
        raise CheckFailed(f"GET {path}: {header} is {headers.get(header)!r}, expected {value}")


async def _get_load(url: str, items: list[Item], concurrency: int, check: Any) -> float:
    """GET every item once with ``concurrency`` connections, checking each body; requests per
    second (``bench_rpc._interleaved``'s ``load``)."""
    import aiohttp

    queue: asyncio.Queue[Item] = asyncio.Queue()
    for item in items:
        queue.put_nowait(item)
    base = url.rstrip("/")

    async def worker(session: aiohttp.ClientSession) -> None:
        while True:
            try:
                item = queue.get_nowait()
            except asyncio.QueueEmpty:
                return
            async with session.get(base + item[0]) as resp:
                body = await resp.read()
                check(item, resp.status, resp.headers, body)

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency)) as session:
        start = time.perf_counter()
        await asyncio.gather(*(worker(session) for _ in range(concurrency)))
        elapsed = time.perf_counter() - start
    return len(items) / elapsed


def _pull(url: str, items: list[Item], concurrency: int, active: Any, stop: Any, counts: Any, conn: Any) -> None:
    """Child process: while ``active`` is set, ``concurrency`` connections GET the items round and
    round, checking each, adding to ``counts`` (shared: downloads, bytes) as each one ends; once
    ``stop`` is set, send (failed downloads, the first failure or None)."""
    import aiohttp

    failures: list[str] = []

    async def main() -> None:
        next_item = iter(range(10**12))
        base = url.rstrip("/")

        async def worker(session: aiohttp.ClientSession) -> None:
            while not stop.is_set():
                if not active.is_set():
                    await asyncio.sleep(0.01)
                    continue
                item = items[next(next_item) % len(items)]
                try:
                    async with session.get(base + item[0]) as resp:
                        body = await resp.read()
                        _check(item, resp.status, resp.headers, body)
                except (CheckFailed, aiohttp.ClientError) as exc:
                    failures.append(str(exc))
                    await asyncio.sleep(0.05)
                    continue
                counts[0] += 1
                counts[1] += len(body)

        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency)) as session:
            conn.send("ready")
            await asyncio.gather(*(worker(session) for _ in range(concurrency)))

    asyncio.run(main())
    conn.send((len(failures), failures[0] if failures else None))


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


async def _latency(url: str, body: bytes, calls: int, blocks: int, active: Any,
                   counts: Any) -> tuple[list[float], list[float], float, int, int]:
    """Sequential getRun calls on one connection, in alternating blocks idle / under load
    (``active`` set): seconds per call of each; the seconds spent in the loaded calls and the
    downloads and bytes the pullers finished meanwhile (from their shared ``counts``)."""
    import aiohttp

    idle: list[float] = []
    loaded: list[float] = []
    loaded_s, pulled, pulled_bytes = 0.0, 0, 0
    per_block = -(-calls // blocks)
    headers = {"Content-Type": "application/json"}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1)) as session:

        async def call() -> float:
            t0 = time.perf_counter()
            async with session.post(url, data=body, headers=headers) as resp:
                reply = json.loads(await resp.read())
            elapsed = time.perf_counter() - t0
            if resp.status != 200 or reply.get("result", {}).get("task_id") != TASK_ID:
                raise CheckFailed(f"getRun: HTTP {resp.status}: {str(reply)[:200]}")
            return elapsed

        for _ in range(20):  # warm: the connection, the view cache
            await call()
        for b in range(blocks):
            n = min(per_block, calls - b * per_block)
            active.clear()
            await asyncio.sleep(0.3)  # the pullers' requests in flight finish
            idle += [await call() for _ in range(n)]
            active.set()
            await asyncio.sleep(0.3)  # the pullers are streaming
            t0, n0, b0 = time.perf_counter(), counts[0], counts[1]
            loaded += [await call() for _ in range(n)]
            loaded_s += time.perf_counter() - t0
            pulled, pulled_bytes = pulled + counts[0] - n0, pulled_bytes + counts[1] - b0
        active.clear()
    return idle, loaded, loaded_s, pulled, pulled_bytes


def bench_store(args: argparse.Namespace, workdir: Path, store: str) -> bool:
    """Parts 1 and 2 on one store; False when a puller's check failed."""
    ours = Server("ours", workdir / "ours", 0, store=store, target=_serve)
    info = ours.info
    raw: Server | None = None
    try:
        raw = Server("raw", workdir / "raw", 0, canned=info, target=_serve)
        payloads: list[Item] = [tuple(p) for p in info["payloads"]]  # type: ignore[misc]
        model: Item = tuple(info["model"])  # type: ignore[assignment]
        mib_p, mib_m = info["payload_bytes"] / 2**20, info["model_bytes"] / 2**20
        print(f"  setup: a sealed run of {TRAINERS} trainers x {SUBMIT_FRAGMENTS} fragments, round 0 committed: "
              f"{len(payloads)} payloads of {mib_p:.2f} MiB, model {mib_m:.2f} MiB (built from the store per GET); "
              f"{info['setup_s']:.1f} s", flush=True)
        urls = (ours.url, raw.url)
        for url in urls:  # warm both: connections, page cache, the service's run cache
            asyncio.run(_get_load(url, payloads[: 2 * args.concurrency] + [model], args.concurrency, _check))
        get_items = [payloads[i % len(payloads)] for i in range(args.requests)]
        ours_p, raw_p = asyncio.run(bench_rpc._interleaved(urls, get_items, args.concurrency, args.blocks, _check,
                                                           _get_load))
        rows = [(f"payload {mib_p:.2f} MiB ({args.concurrency} conns)", raw_p, ours_p, mib_p)]
        if args.model_requests:
            ours_m, raw_m = asyncio.run(bench_rpc._interleaved(urls, [model] * args.model_requests, args.concurrency,
                                                               args.blocks, _check, _get_load))
            rows.append((f"model {mib_m:.2f} MiB ({args.concurrency} conns)", raw_m, ours_m, mib_m))
        print(f"  downloads (loopback): {args.requests} payload GETs, {args.model_requests} model GETs, "
              f"{args.blocks} alternating blocks per server; every body's SHA-256 checked")
        print(f"  {'artifact':<30} {'raw req/s':>10} {'ours req/s':>11} {'raw MiB/s':>10} {'ours MiB/s':>11} "
              f"{'ours/raw':>9}  target")
        for name, r, o, mib in rows:
            print(f"  {name:<30} {r:>10.1f} {o:>11.1f} {r * mib:>10.1f} {o * mib:>11.1f} {o / r:>8.2f}x  none",
                  flush=True)
        raw.close()
        raw = None

        ctx = mp.get_context("spawn")
        active, stop = ctx.Event(), ctx.Event()
        counts = ctx.RawArray("q", 2)  # written by the puller only, read here
        conn, child = ctx.Pipe()
        puller = ctx.Process(target=_pull, args=(ours.url, payloads, args.pullers, active, stop, counts, child),
                             daemon=True)
        puller.start()
        try:
            if not conn.poll(60):
                raise RuntimeError("the puller did not start")
            conn.recv()
            idle, loaded, loaded_s, n, nbytes = asyncio.run(
                _latency(ours.url, info["get_body"].encode(), args.latency_calls, args.blocks, active, counts))
        finally:
            stop.set()
            failed, first = conn.recv() if conn.poll(60) else (1, "the puller did not answer")
            puller.join(30)
        i50, i99, l50, l99 = (1000 * _percentile(v, q) for v in (idle, loaded) for q in (0.5, 0.99))
        print(f"  getRun latency (ms; {args.latency_calls} sequential calls per column on one connection, "
              f"{args.blocks} alternating blocks), idle vs while {args.pullers} connections pull payloads:")
        print(f"  {'':<8} {'idle':>8} {'loaded':>8} {'loaded/idle':>12}  target")
        print(f"  {'p50':<8} {i50:>8.2f} {l50:>8.2f} {l50 / i50:>11.2f}x  none")
        print(f"  {'p99':<8} {i99:>8.2f} {l99:>8.2f} {l99 / i99:>11.2f}x  none")
        print(f"  {'mean':<8} {1000 * statistics.fmean(idle):>8.2f} {1000 * statistics.fmean(loaded):>8.2f}")
        print(f"  during the loaded calls ({loaded_s:.1f} s) the pullers finished {n} payload downloads, "
              f"{nbytes / 2**20 / max(loaded_s, 1e-9):.1f} MiB/s; failed downloads: {failed}", flush=True)
        if failed:
            print(f"  FAILED: a puller's download: {first}")
        return not failed
    finally:
        if raw is not None:
            raw.close()
        ours.close()


# --- main -----------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=640, help="payload GETs per server")
    parser.add_argument("--model-requests", type=int, default=32, help="model GETs per server (0: skip)")
    parser.add_argument("--concurrency", type=int, default=4, help="client connections in the download bench")
    parser.add_argument("--blocks", type=int, default=4,
                        help="alternating blocks per server / per latency column (drift hits both alike)")
    parser.add_argument("--latency-calls", type=int, default=400, help="getRun calls per latency column")
    parser.add_argument("--pullers", type=int, default=4, help="connections pulling payloads during the loaded column")
    parser.add_argument("--store", choices=["memory", "rocksdb", "both"], default="both",
                        help="the node's store: rocksdb is what a node runs; memory isolates the rest")
    args = parser.parse_args(argv)
    for name in ("requests", "concurrency", "blocks", "latency_calls", "pullers"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.model_requests < 0:
        parser.error("--model-requests must be at least 0")
    started = time.perf_counter()
    print(f"load average before: {os.getloadavg()[0]:.2f}  cpus: {os.cpu_count()}", flush=True)
    ok = True
    with tempfile.TemporaryDirectory(prefix="bench-artifacts-") as tmp:
        for store in ["memory", "rocksdb"] if args.store == "both" else [args.store]:
            print(f"run artifacts over HTTP, {store} store:", flush=True)
            try:
                ok &= bench_store(args, Path(tmp) / store, store)
            except CheckFailed as exc:
                print(f"  FAILED: {exc}", flush=True)
                ok = False
    print(f"load average after: {os.getloadavg()[0]:.2f}; total {time.perf_counter() - started:.0f} s")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
