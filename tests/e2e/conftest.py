"""End-to-end fixtures: REAL ``tenzro node --dev`` processes, a JSON-RPC client, a tiny task.

Every node is started as ``python -m tenzro_training.cli node --dev --data-dir D --rpc-port 0
--config C`` in its own process (a tmp data dir, a free port read back from the "listening" line)
with tiny timings, so whole runs take seconds. The task is small on purpose (M=3, K=2, F=2,
2 rounds, a ~2k-parameter timesfm model from ``trainer.model.create_init_checkpoint``).

Nothing here knows the node's internals: tests talk to it over HTTP (raw JSON-RPC, or the CLI as
a subprocess) exactly as a sponsor, trainer or syncer would.
"""

from __future__ import annotations

import base64
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import pytest

from tenzro_training import auth
from tenzro_training.payload import ENCODING_RAW, PayloadHeader, compute_payload_hash, encode_payload

REPO = Path(__file__).resolve().parents[2]
STARTUP_TIMEOUT_S = 60.0

# Tiny model: every run's init checkpoint (shared by all nodes so equal specs hash equally).
MODEL_META = {"context_len": 16, "horizon": 4, "patch_len": 8, "d_model": 8, "n_layers": 1, "n_heads": 2, "d_ff": 16}

# Node-wide timings for the shared node: short election, generous everything else, so that no
# deadline fires while a test (or a CLI subprocess) is between two calls.
BASE_TIMINGS = {
    "election_window_ms": 300,
    "enrollment_window_ms": 30_000,
    "round_timeout_ms": 90_000,
    "finalize_window_ms": 60_000,
}
MAX_BODY_BYTES = 1 << 20  # small, so the oversized-body test sends only ~1 MiB


# --- JSON-RPC over HTTP ---------------------------------------------------------------------------


class RpcFailure(AssertionError):
    """A call that answered a JSON-RPC error where a result was expected."""

    def __init__(self, method: str, error: dict[str, Any]) -> None:
        self.error = error
        super().__init__(f"{method} -> {error}")


def post_raw(url: str, body: bytes, timeout: float = 60.0) -> tuple[int, Any]:
    """POST ``body``; return (HTTP status, decoded JSON body or None)."""
    req = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            status, raw = resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        status, raw = exc.code, exc.read()
    return status, (json.loads(raw) if raw else None)


_ids = iter(range(1, 1 << 62))


def rpc_reply(url: str, method: str, params: Any) -> dict[str, Any]:
    """The whole JSON-RPC reply object (``result`` or ``error``)."""
    body = json.dumps({"jsonrpc": "2.0", "id": next(_ids), "method": method, "params": params}).encode()
    status, reply = post_raw(url, body)
    assert status == 200, (status, reply)
    assert isinstance(reply, dict) and reply.get("jsonrpc") == "2.0", reply
    return reply


def rpc(url: str, method: str, params: Any) -> Any:
    """The result; RpcFailure on an error answer."""
    reply = rpc_reply(url, method, params)
    if "error" in reply:
        raise RpcFailure(method, reply["error"])
    return reply["result"]


def scrape_metrics(url: str) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """``GET /metrics`` parsed by prometheus_client: sample name -> {sorted labels: value}."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(url.rstrip("/") + "/metrics", timeout=10) as resp:
        assert resp.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        text = resp.read().decode()
    out: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return out


def scrape_metric_families(url: str) -> dict[str, tuple[str, frozenset[str]]]:
    """``GET /metrics`` as its metric families: exposed name (counters with ``_total``) ->
    (type, label names seen on its samples, histogram ``le`` left out)."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(url.rstrip("/") + "/metrics", timeout=10) as resp:
        text = resp.read().decode()
    out: dict[str, tuple[str, frozenset[str]]] = {}
    for family in text_string_to_metric_families(text):
        name = family.name + "_total" if family.type == "counter" else family.name
        labels = frozenset(k for sample in family.samples for k in sample.labels if k != "le")
        out[name] = (family.type, labels)
    return out


def documented_metrics() -> dict[str, tuple[str, frozenset[str]]]:
    """docs/node.md's metrics table: name -> (type, label names)."""
    import re

    out: dict[str, tuple[str, frozenset[str]]] = {}
    for line in (REPO / "docs" / "node.md").read_text().splitlines():
        row = re.match(r"\| `(tenzro_[a-z_]+)` \| (counter|gauge|histogram) \|([^|]*)\|", line)
        if row:
            out[row[1]] = (row[2], frozenset(re.findall(r"`([a-z_]+)`", row[3])))
    return out


def rpc_error(url: str, method: str, params: Any) -> dict[str, Any]:
    """The error object of a call that must fail."""
    reply = rpc_reply(url, method, params)
    assert "error" in reply, f"{method} should have failed, got {reply.get('result')}"
    return reply["error"]


# --- node processes -----------------------------------------------------------------------------


@dataclass
class NodeProcess:
    """A running ``tenzro node`` subprocess."""

    data_dir: Path
    config: Path
    proc: subprocess.Popen[str]
    url: str
    stderr_path: Path
    stdout_lines: list[str] = field(default_factory=list)

    @property
    def accounts(self) -> dict[str, dict[str, Any]]:
        """dev-accounts.json by ``role:index`` (``sponsor:0``, ``trainer:3``, ``syncer:1``)."""
        doc = json.loads((self.data_dir / "dev-accounts.json").read_text())
        return {f"{a['role']}:{a['index']}": a for a in doc["accounts"]}

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        return self.proc.wait(timeout=timeout)

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(timeout=30)

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")


def node_command(data_dir: Path, config: Path | None, port: int = 0) -> list[str]:
    cmd = [sys.executable, "-m", "tenzro_training.cli", "node", "--dev", "--data-dir", str(data_dir), "--rpc-port", str(port)]
    if config is not None:
        cmd += ["--config", str(config)]
    return cmd


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("OMP_NUM_THREADS", "1")  # two nodes + pytest share 2 cores
    return env


@contextmanager
def sighup_at_default_in_children() -> Iterator[None]:
    """Processes started inside get SIGHUP at its default disposition, as from a terminal.

    Under ``nohup`` this process ignores SIGHUP and its children inherit that, and a node started
    ignoring SIGHUP rightly keeps running on one (tests/node/test_main.py): a test of the
    hangup shutdown would wait out its timeout (a CI run launched with nohup did). A no-op
    handler is reset to the default by exec in the child, while this process still outlives a
    hangup; the ignore is put back on exit."""
    if signal.getsignal(signal.SIGHUP) is not signal.SIG_IGN:
        yield
        return
    signal.signal(signal.SIGHUP, lambda signum, frame: None)
    try:
        yield
    finally:
        signal.signal(signal.SIGHUP, signal.SIG_IGN)


def start_node(
    data_dir: Path, config: Path, *, log_name: str = "node", extra_args: tuple[str, ...] = (),
    env: dict[str, str] | None = None,
) -> NodeProcess:
    """Start a dev node and wait for its "listening" line (fails with its stderr otherwise).

    ``extra_args`` go to ``tenzro node`` (e.g. ``--p2p-listen``), ``env`` to its environment;
    every stdout line up to and after "listening" is kept in ``NodeProcess.stdout_lines``."""
    data_dir.mkdir(parents=True, exist_ok=True)
    n = len(list(data_dir.parent.glob(f"{log_name}*.stderr")))
    stderr_path = data_dir.parent / f"{log_name}-{n}.stderr"
    err = stderr_path.open("w")
    proc = subprocess.Popen(
        node_command(data_dir, config) + list(extra_args), cwd=REPO, env={**_child_env(), **(env or {})},
        stdout=subprocess.PIPE, stderr=err,
        text=True, bufsize=1,
    )
    err.close()
    lines: queue.Queue[str | None] = queue.Queue()
    collected: list[str] = []

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            collected.append(line)
            lines.put(line)
        lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while True:
        try:
            line = lines.get(timeout=max(0.1, deadline - time.monotonic()))
        except queue.Empty:
            proc.kill()
            raise AssertionError(f"node did not start in {STARTUP_TIMEOUT_S}s:\n{stderr_path.read_text()}") from None
        if line is None:
            raise AssertionError(f"node exited with {proc.wait()} before listening:\n{stderr_path.read_text()}")
        if line.startswith("tenzro node listening on "):
            url = line.split(" on ", 1)[1].split(" ", 1)[0] + "/"
            assert f"(data dir {data_dir.resolve()})" in line, line
            return NodeProcess(data_dir, config, proc, url, stderr_path, collected)


def write_config(path: Path, **overrides: Any) -> Path:
    timings = dict(BASE_TIMINGS)
    timings.update(overrides.pop("timings", {}))
    doc = {"timings": timings, "max_body_bytes": MAX_BODY_BYTES, **overrides}
    path.write_text(json.dumps(doc, indent=2))
    return path


@pytest.fixture(scope="session")
def e2e_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("e2e")


@pytest.fixture(scope="session")
def node(e2e_dir: Path) -> Iterator[NodeProcess]:
    """The shared dev node (tests use distinct task ids on it)."""
    proc = start_node(e2e_dir / "shared" / "data", write_config(e2e_dir / "shared.json"), log_name="shared")
    yield proc
    code = proc.stop()
    assert code == 0, proc.stderr()
    assert "Traceback" not in proc.stderr(), proc.stderr()


@pytest.fixture
def node_factory(tmp_path: Path) -> Iterator[Callable[..., NodeProcess]]:
    """Start extra nodes (own data dirs) for one test; every one is stopped afterwards."""
    started: list[NodeProcess] = []

    def factory(name: str = "node", data_dir: Path | None = None, extra_args: tuple[str, ...] = (), **config: Any) -> NodeProcess:
        cfg = write_config(tmp_path / f"{name}.json", **config)
        proc = start_node(data_dir or (tmp_path / name / "data"), cfg, log_name=name, extra_args=extra_args)
        started.append(proc)
        return proc

    yield factory
    for proc in started:
        if proc.proc.poll() is None:
            proc.kill()


# --- the task -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class TinyModel:
    checkpoint: Path
    sha256: str


@pytest.fixture(scope="session")
def tiny_model(e2e_dir: Path) -> TinyModel:
    from tenzro_training.trainer.model import config_from_metadata, create_init_checkpoint, save_checkpoint

    path = e2e_dir / "init.safetensors"
    sha = save_checkpoint(create_init_checkpoint(config_from_metadata(MODEL_META), 7), path)
    return TinyModel(path, sha)


def make_spec(model: TinyModel, task_id: str, sponsor: str, **changes: Any) -> dict[str, Any]:
    from tenzro_training.trainer.model import config_from_metadata, count_params

    spec = {
        "task_id": task_id,
        "sponsor_did": "did:tenzro:human:dev-sponsor",
        "sponsor_address": sponsor,
        "architecture": {
            "family": "timesfm",
            "param_count": count_params(config_from_metadata(MODEL_META)),
            "modality": "Timeseries",
            "fragment_count": 2,
            "dtype": "fp32",
            "metadata": {**MODEL_META, "init_checkpoint": {"uri": model.checkpoint.as_uri(), "sha256": model.sha256}},
        },
        "tier": "Open",
        "aggregation": "Mean",
        "trainer_count": 3,
        "quorum": 2,
        "inner_steps": 2,
        "max_rounds": 2,
        # Long enough that "finalize before the straggler window closes" is refused even on a
        # loaded machine; every test closes its accepted sets by having all trainers submit.
        "grace_window_ms": 5_000,
        "reward_pool": str(10**21),
        "dataset_ref": "statsmodels:co2,nile",
        "dataset_hash": "0x" + "11" * 32,
        "min_throughput": None,
        "created_at": 1761350400,
    }
    spec.update(changes)
    return spec


@dataclass
class Task:
    """A task on a node plus everything needed to act in it."""

    url: str
    spec: dict[str, Any]
    accounts: dict[str, dict[str, Any]]
    layouts: tuple[Any, ...]
    chain_id: int = auth.DEFAULT_CHAIN_ID

    @property
    def task_id(self) -> str:
        return str(self.spec["task_id"])

    def key(self, who: str) -> bytes:
        return bytes.fromhex(self.accounts[who]["private_key"][2:])

    def address(self, who: str) -> str:
        return str(self.accounts[who]["address"])

    def who_is(self, address: str) -> str:
        return next(name for name, a in self.accounts.items() if a["address"].lower() == address.lower())

    def sign(self, msg: auth.SignedMessageType, who: str) -> str:
        return "0x" + auth.sign_message(msg, self.key(who), self.chain_id).hex()

    # --- calls (params as a client builds them) ---

    def post_params(self, who: str = "sponsor:0") -> dict[str, Any]:
        from tenzro_training.spec import TrainingTaskSpec

        spec = TrainingTaskSpec.from_dict(self.spec)
        return {"spec": self.spec, "signature": self.sign(auth.PostTask(task_id=self.task_id, spec_hash=spec.spec_hash()), who)}

    def enroll_params(self, who: str, stake: int = 10**18, did: str | None = None) -> dict[str, Any]:
        did = did or f"did:tenzro:trainer:{who.replace(':', '-')}"
        msg = auth.EnrollTrainer(task_id=self.task_id, did=did, trainer=bytes.fromhex(self.address(who)[2:]), stake=stake)
        return {"task_id": self.task_id, "did": did, "address": self.address(who), "stake": str(stake), "signature": self.sign(msg, who)}

    def payload(self, who: str, round_: int, fragment: int, seed: int = 0) -> bytes:
        from tenzro_training.cli.layouts import compute_random_gradient

        layout = self.layouts[fragment]
        flat = compute_random_gradient(layout, seed, f"{self.task_id}/{who}", round_, 1e-3)
        header = PayloadHeader(self.task_id, round_, fragment, ENCODING_RAW, layout.layout_hash())
        return encode_payload(header, layout, flat)

    def submit_params(self, who: str, round_: int, fragment: int, payload: bytes) -> dict[str, Any]:
        msg = auth.SubmitOuterGradient(
            task_id=self.task_id, round=round_, fragment=fragment, payload_hash=compute_payload_hash(payload)
        )
        return {
            "task_id": self.task_id, "round": round_, "fragment": fragment,
            "payload": base64.b64encode(payload).decode(), "signature": self.sign(msg, who),
        }

    def finalize_params(self, who: str, round_: int) -> dict[str, Any]:
        return {"task_id": self.task_id, "round": round_, "signature": self.sign(auth.FinalizeRound(task_id=self.task_id, round=round_), who)}

    def cancel_params(self, who: str = "sponsor:0") -> dict[str, Any]:
        return {"task_id": self.task_id, "signature": self.sign(auth.CancelTask(task_id=self.task_id), who)}

    # --- actions ---

    def get(self) -> dict[str, Any]:
        return rpc(self.url, "tenzro_training_getRun", {"task_id": self.task_id})

    def post(self) -> dict[str, Any]:
        return rpc(self.url, "tenzro_training_postTask", self.post_params())

    def enroll(self, who: str, **kw: Any) -> dict[str, Any]:
        return rpc(self.url, "tenzro_training_enrollTrainer", self.enroll_params(who, **kw))

    def submit(self, who: str, round_: int, fragment: int, seed: int = 0) -> dict[str, Any]:
        params = self.submit_params(who, round_, fragment, self.payload(who, round_, fragment, seed))
        return rpc(self.url, "tenzro_training_submitOuterGradient", params)

    def finalize(self, who: str, round_: int) -> dict[str, Any]:
        return rpc(self.url, "tenzro_training_finalizeRound", self.finalize_params(who, round_))

    def wait_for(self, predicate: Callable[[dict[str, Any]], bool], what: str, timeout: float = 30.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            view = self.get()
            if predicate(view):
                return view
            if time.monotonic() > deadline:
                raise AssertionError(f"{self.task_id}: timed out waiting for {what}; last view: {json.dumps(view)[:2000]}")
            time.sleep(0.05)

    def wait_status(self, status: str, timeout: float = 30.0) -> dict[str, Any]:
        return self.wait_for(lambda v: v["status"] == status, f"status {status}", timeout)

    def syncer_by_rank(self, view: dict[str, Any], rank: int) -> str:
        """``syncer:N`` name of the candidate ranked ``rank`` (1 = the elected syncer)."""
        entry = view["election"]["ranking"][rank - 1]
        assert entry["rank"] == rank
        return self.who_is(entry["address"])


def new_task(model: TinyModel, node: NodeProcess, task_id: str, **changes: Any) -> Task:
    """A Task value (not yet posted) on ``node`` with the tiny spec and the dev accounts."""
    from tenzro_training.cli.layouts import compute_task_layouts
    from tenzro_training.spec import TrainingTaskSpec

    accounts = node.accounts
    spec = make_spec(model, task_id, accounts["sponsor:0"]["address"], **changes)
    layouts = compute_task_layouts(TrainingTaskSpec.from_dict(spec))
    return Task(node.url, spec, accounts, layouts)


TRAINERS = ("trainer:0", "trainer:1", "trainer:2")


def run_to_training(task: Task, trainers: tuple[str, ...] = TRAINERS) -> dict[str, Any]:
    """Post, wait for the election, enroll ``trainers`` (in order); return the Training view."""
    task.post()
    task.wait_status("Enrolling")
    for who in trainers:
        task.enroll(who)
    return task.wait_status("Training")


def receipt_without_sealed_at(receipt: dict[str, Any]) -> dict[str, Any]:
    inner = dict(receipt.get("receipt", receipt))
    inner.pop("sealed_at")
    return inner


# --- CLI subprocesses -------------------------------------------------------------------------------


@dataclass(frozen=True)
class CliResult:
    code: int
    out: str
    err: str

    def json(self) -> Any:
        return json.loads(self.out)


def tenzro(*argv: str, timeout: float = 120.0, env: dict[str, str] | None = None) -> CliResult:
    """Run ``python -m tenzro_training.cli ARGV`` and capture its outcome."""
    proc = subprocess.run(
        [sys.executable, "-m", "tenzro_training.cli", *argv], cwd=REPO, env={**_child_env(), **(env or {})},
        capture_output=True, text=True, timeout=timeout,
    )
    return CliResult(proc.returncode, proc.stdout, proc.stderr)


# --- gossip runs: a node with libp2p on, trainer and syncer processes ------------------------------


def start_p2p_node(tmp_path: Path, **config_overrides: Any) -> tuple[NodeProcess, str]:
    """A dev node with gossip on; returns it and its p2p multiaddr (printed before "listening")."""
    config = write_config(tmp_path / "node.json", **config_overrides)
    node = start_node(tmp_path / "node" / "data", config, extra_args=("--p2p-listen", "/ip4/127.0.0.1/tcp/0"))
    addrs = [line.split()[3] for line in list(node.stdout_lines) if line.startswith("tenzro node p2p ")]
    assert addrs, "the node printed no p2p address before listening"
    return node, addrs[0]


class Child:
    """A CLI subprocess (``python -m module ARGV``, the ``tenzro`` command by default) with stdout
    and stderr in files."""

    def __init__(self, name: str, argv: list[str], tmp_path: Path, module: str = "tenzro_training.cli",
                 env: dict[str, str] | None = None) -> None:
        self.name = name
        self.argv = argv
        self.out_path = tmp_path / f"{name}.out"
        self.err_path = tmp_path / f"{name}.err"
        out: IO[str] = self.out_path.open("w")
        err: IO[str] = self.err_path.open("w")
        self.proc = subprocess.Popen([sys.executable, "-m", module, *argv], cwd=REPO,
                                     env={**_child_env(), **(env or {})}, stdout=out, stderr=err, text=True)
        out.close()
        err.close()

    def out(self) -> str:
        return self.out_path.read_text(errors="replace")

    def err(self) -> str:
        return self.err_path.read_text(errors="replace")

    def wait(self, timeout: float) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"{self.name} did not finish:\n{self.out()}\n{self.err()[-4000:]}") from None

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def trainer_argv(node: NodeProcess, task_id: str, spec_path: Path | None, who: str, p2p_addr: str, key: Path,
                 *extra: str) -> list[str]:
    """``spec_path=None``: the trainer takes the spec getRun serves (checked against spec_hash)."""
    spec = [] if spec_path is None else ["--spec", str(spec_path)]
    return ["trainer", "run", "--key-file", str(node.data_dir / "dev-accounts.json"), "--account", who,
            "--task-id", task_id, *spec, "--rpc", node.url, "--p2p-key", str(key),
            "--bootstrap", p2p_addr, *extra]


def start_gossip_run(tmp_path: Path, tiny_model: TinyModel, task_id: str, children: list[Child], *,
                     aggregation: Any = "Mean", metadata: dict[str, Any] | None = None,
                     attacker_env: dict[str, str] | None = None,
                     dataset_ref: str = "statsmodels:co2,nile",
                     devices: tuple[str, str, str] = ("cpu", "cpu", "cpu"),
                     trainer_args: tuple[tuple[str, ...], ...] = ((), (), ())) -> tuple[NodeProcess, Task, list[Child]]:
    """A node with gossip on, the task posted (the tiny model on real data, M = K = 3, 2 rounds;
    ``metadata`` merged into ``architecture.metadata``), the rank-1 syncer daemon and three
    trainer processes (``--device`` from ``devices``, then ``trainer_args``), all started. With ``attacker_env``, ``trainer:2`` is
    ``tests/e2e/byzantine_trainer.py`` run with that environment. Every process started but the
    node is appended to ``children`` as it starts (the caller stops them, then the node; if this
    raises, it has stopped them all)."""
    from tenzro_training.trainer.data import compute_dataset_hash, load_corpus

    node, p2p_addr = start_p2p_node(tmp_path)
    try:
        dataset_hash = "0x" + compute_dataset_hash(load_corpus(dataset_ref)).hex()
        task = new_task(tiny_model, node, task_id, aggregation=aggregation, quorum=3, dataset_ref=dataset_ref,
                        dataset_hash=dataset_hash)
        task.spec["architecture"]["metadata"].update(metadata or {})
        spec_path = tmp_path / "spec.json"
        spec_path.write_text(json.dumps(task.spec))
        task.post()
        view = task.wait_status("Enrolling")
        children.append(Child("syncer", ["syncer", "run", "--key-file", str(node.data_dir / "dev-accounts.json"),
                                          "--account", task.syncer_by_rank(view, 1), "--rpc", node.url,
                                          "--poll-interval", "0.1"], tmp_path))
        trainers = []
        for i in range(3):
            argv = trainer_argv(node, task.task_id, spec_path, f"trainer:{i}", p2p_addr, tmp_path / f"t{i}.p2p-key",
                                "--device", devices[i], *trainer_args[i])
            if i == 2 and attacker_env is not None:
                trainers.append(Child("attacker", argv, tmp_path, module="tests.e2e.byzantine_trainer", env=attacker_env))
            else:
                trainers.append(Child(f"trainer{i}", argv, tmp_path))
            children.append(trainers[-1])
    except BaseException:
        for child in children:
            child.stop()
        node.stop()
        raise
    return node, task, trainers
