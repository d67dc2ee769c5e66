"""Byzantine probe: one real run in which some trainers attack, and what it did to the model.

A real ``tenzro node --dev`` with gossip on, the syncer daemon and M real ``tenzro trainer run``
processes carry the shipped dev example (statsmodels data; its rule, trainer count, quorum and
rounds replaced by the flags) to its end. The trainers named by ``--attackers`` run through
``tests/e2e/byzantine_trainer.py``: the real trainer with its outer gradients replaced just
before they are signed (``--attack const|signflip|noise``, ``--value``), so the node accepts
every payload. Prints one JSON object: the run's status, every trainer's exit status, the
held-out loss of the initial and the final model (``tenzro train evaluate-model``), what each
trainer is paid (the receipt's weights, ``ledger.compute_payouts``), per fragment result how
many values TrimmedMean trimmed and which payload Krum selected, and whether ``verify-run``
passed. docs/aggregation.md "What each rule tolerates" has the table these runs made.

    .venv/bin/python scripts/probe_byzantine.py --rule '"CoordinateMedian"' --attack signflip --value 10
    .venv/bin/python scripts/probe_byzantine.py --rule '{"TrimmedMean": {"alpha_bps": 2000}}' --quorum 4
    .venv/bin/python scripts/probe_byzantine.py --attackers '' --encoding '{"topk": {"density_bps": 100}}'

``--encoding`` selects the spec's payload encoding (docs/payload.md "topk", "q8"); the output then
also gives what one trainer sent in round 0 (``payload_bytes_per_trainer_round``).

``--restart-every N`` runs every trainer with ``--rounds N`` and starts it again (same key and
state directory) each time it stops, until the run ends: a run of trainers that restart, as on
preemptible machines. With ``--forget-feedback`` each restart first deletes the trainer's saved
error-feedback state (``feedback-round-*.safetensors``), so a topk trainer starts its residual
from zero, as trainers did before the state was saved; the output gives ``restarts``.

    .venv/bin/python scripts/probe_byzantine.py --attackers '' --encoding '{"topk": {"density_bps": 100}}' \
        --rounds 30 --restart-every 3 [--forget-feedback]

Exit 0 when the run ended or its trainers stopped (Sealed or not: that is the finding; a trainer
still running after ``--timeout`` is stopped and reported as "timed out"), 1 when the run could
not be set up (a CLI step failed: its message is printed), 2 for bad flags.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tenzro_training.ledger import compute_payouts  # noqa: E402
from tenzro_training.receipt import TrainingReceipt  # noqa: E402
from tests.e2e.conftest import Child, rpc, start_p2p_node, tenzro, trainer_argv  # noqa: E402

TASK_ID = "byzantine-probe"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rule", default='"Mean"', help="the spec's aggregation, as JSON (default \"Mean\")")
    ap.add_argument("--attack", choices=["const", "signflip", "noise"], default="const")
    ap.add_argument("--value", type=float, default=None,
                    help="const: every value (default 1e6); signflip: the factor (default 10); noise: sigma (default 1)")
    ap.add_argument("--attackers", default="4", help="comma-separated trainer indices, or '' for none (default 4)")
    ap.add_argument("--trainers", type=int, default=5, help="M (default 5)")
    ap.add_argument("--quorum", type=int, default=5, help="K (default 5)")
    ap.add_argument("--rounds", type=int, default=10, help="max_rounds (default 10)")
    ap.add_argument("--grace-ms", type=int, default=5000, help="straggler window (default 5000)")
    ap.add_argument("--max-gradient-abs", type=float, default=None, help="node config (default: the node's, 1e6)")
    ap.add_argument("--encoding", default=None,
                    help='the spec\'s outer_gradient_encoding, as JSON, e.g. \'{"topk": {"density_bps": 100}}\' '
                         "(default: none, raw payloads)")
    ap.add_argument("--metadata", default=None,
                    help='merged into the spec\'s architecture.metadata, as JSON, e.g. \'{"outer_lr": 1.4}\'')
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds to wait for the trainers (default 900)")
    ap.add_argument("--restart-every", type=int, default=None,
                    help="each trainer stops after this many rounds and is started again, until the run ends")
    ap.add_argument("--forget-feedback", action="store_true",
                    help="with --restart-every: delete the trainer's saved error-feedback state before each restart")
    args = ap.parse_args(argv)
    if args.restart_every is not None and args.restart_every < 1:
        ap.error("--restart-every must be positive")
    if args.forget_feedback and args.restart_every is None:
        ap.error("--forget-feedback needs --restart-every")
    if args.encoding is not None:
        from tenzro_training.compression import PayloadEncoding
        from tenzro_training.errors import SpecError

        try:
            args.encoding = PayloadEncoding.from_json(json.loads(args.encoding)).to_json()
        except (ValueError, SpecError) as exc:
            ap.error(f"--encoding: {exc}")
    if args.metadata is not None:
        try:
            args.metadata = json.loads(args.metadata)
        except ValueError as exc:
            ap.error(f"--metadata: {exc}")
        if not isinstance(args.metadata, dict):
            ap.error("--metadata must be a JSON object")
    try:
        args.attackers = {int(x) for x in args.attackers.split(",") if x.strip()}
    except ValueError:
        ap.error(f"--attackers must be comma-separated trainer indices or '', got {args.attackers!r}")
    if not all(0 <= i < args.trainers for i in args.attackers):
        ap.error(f"--attackers must name trainers 0..{args.trainers - 1}")
    if args.value is None:
        args.value = {"const": 1e6, "signflip": 10.0, "noise": 1.0}[args.attack]
    return args


def checked(*argv: str) -> Any:
    """A ``tenzro ... --json`` call that must succeed."""
    r = tenzro(*argv, "--json", timeout=600)
    if r.code != 0:
        raise SystemExit(f"tenzro {' '.join(argv[:2])} failed ({r.code}): {r.err.strip()}")
    return r.json()


def wait_or_stop(child: Child, deadline: float) -> int | str:
    """The trainer's exit status, or "timed out" (it is stopped) once ``deadline`` passed."""
    try:
        return child.wait(max(deadline - time.monotonic(), 0.1))
    except AssertionError:  # Child.wait killed it
        return "timed out"


def supervise(trainers: dict[int, Child], relaunch: Any, url: str, deadline: float) -> tuple[dict[int, Any], int]:
    """Wait for every trainer; one that stops with status 0 while the run is still Training is
    started again (``relaunch(i)`` returns its new process). Returns each trainer's last exit
    status (or "timed out") and the number of restarts."""
    exits: dict[int, Any] = {}
    restarts = 0
    while len(exits) < len(trainers):
        for i, child in trainers.items():
            if i in exits or child.proc.poll() is None:
                continue
            code = child.proc.returncode
            if code == 0 and rpc(url, "tenzro_training_getRun", {"task_id": TASK_ID})["status"] == "Training":
                trainers[i] = relaunch(i)
                restarts += 1
            else:
                exits[i] = code
        if time.monotonic() > deadline:
            for i, child in trainers.items():
                if i not in exits:
                    exits[i] = wait_or_stop(child, deadline)
        time.sleep(0.2)
    return exits, restarts


def fragment_results(view: dict[str, Any], rule: Any, names: dict[str, str]) -> dict[str, Any]:
    """TrimmedMean: the per-side counts trimmed over every fragment result; Krum: whose payload
    each fragment result selected (the round records' ``trimmed`` and ``selected``)."""
    fragments = [f for record in view["round_records"] for f in record["fragments"]]
    if isinstance(rule, dict) and "TrimmedMean" in rule:
        return {"trimmed_per_side": sorted({f["trimmed"] for f in fragments})}
    if isinstance(rule, dict) and "Krum" in rule:
        selected = [names.get(f["accepted"][f["selected"]].lower(), "?") for f in fragments]
        return {"krum_selected": {name: selected.count(name) for name in sorted(set(selected))}}
    return {}


def payload_bytes(url: str, record: dict[str, Any]) -> int:
    """What one trainer sent in one round: the sizes of the first accepted trainer's payloads of
    every fragment of ``record`` (the artifact route serves a committed round's payloads)."""
    import urllib.request

    total = 0
    for f, fragment in enumerate(record["fragments"]):
        route = f"{url.rstrip('/')}/artifacts/v1/runs/{TASK_ID}/payloads/{record['round']}/{f}/{fragment['accepted'][0]}"
        with urllib.request.urlopen(route, timeout=60) as answer:
            total += len(answer.read())
    return total


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="tenzro-byzantine-") as tmp:
        work = Path(tmp)
        config = {} if args.max_gradient_abs is None else {"max_gradient_abs": args.max_gradient_abs}
        node, p2p_addr = start_p2p_node(work, **config)
        children: list[Child] = []
        try:
            keys = str(node.data_dir / "dev-accounts.json")
            accounts = node.accounts
            names = {a["address"].lower(): name for name, a in accounts.items()}
            spec0, spec1, spec = work / "spec0.json", work / "spec1.json", work / "spec.json"
            checked("train", "example-spec", "--task-id", TASK_ID, "--out", str(spec0))
            doc = json.loads(spec0.read_text())
            doc.update(aggregation=json.loads(args.rule), trainer_count=args.trainers, quorum=args.quorum,
                       max_rounds=args.rounds, grace_window_ms=args.grace_ms)
            if args.encoding is not None:
                doc["architecture"]["metadata"]["outer_gradient_encoding"] = args.encoding
            doc["architecture"]["metadata"].update(args.metadata or {})
            spec1.write_text(json.dumps(doc))
            checked("train", "init-checkpoint", "--spec", str(spec1), "--out", str(work / "init.safetensors"),
                    "--spec-out", str(spec))
            posted = tenzro("train", "post-task", "--spec", str(spec), "--key-file", keys, "--account", "sponsor",
                            "--rpc", node.url, "--json")
            if posted.code != 0:
                raise SystemExit(f"post-task failed: {posted.err.strip()}")
            deadline = time.monotonic() + 60
            while (view := rpc(node.url, "tenzro_training_getRun", {"task_id": TASK_ID}))["status"] != "Enrolling":
                if time.monotonic() > deadline:
                    raise SystemExit(f"the run did not reach Enrolling: {view['status']}")
                time.sleep(0.1)
            syncer = names[view["election"]["ranking"][0]["address"].lower()]
            children.append(Child("syncer", ["syncer", "run", "--key-file", keys, "--account", syncer, "--rpc",
                                             node.url, "--poll-interval", "0.1"], work))
            starts = dict.fromkeys(range(args.trainers), 0)

            def launch(i: int) -> Child:
                every = [] if args.restart_every is None else ["--rounds", str(args.restart_every)]
                argv_i = trainer_argv(node, TASK_ID, spec, f"trainer:{i}", p2p_addr, work / f"t{i}.p2p-key",
                                      "--device", "cpu", *every)
                name = f"{'attacker' if i in args.attackers else 'trainer'}{i}" + (f"-{starts[i]}" if starts[i] else "")
                if starts[i] and args.forget_feedback:
                    address = accounts[f"trainer:{i}"]["address"].lower()
                    for saved in (work / "tenzro-trainer-state" / f"task-{TASK_ID}" / address).glob("feedback-round-*"):
                        saved.unlink()
                starts[i] += 1
                if i in args.attackers:
                    child = Child(name, argv_i, work, module="tests.e2e.byzantine_trainer",
                                  env={"TENZRO_BYZANTINE_ATTACK": args.attack, "TENZRO_BYZANTINE_VALUE": repr(args.value)})
                else:
                    child = Child(name, argv_i, work)
                children.append(child)
                return child

            started = time.monotonic()
            trainers = {i: launch(i) for i in range(args.trainers)}
            ended, restarts = supervise(trainers, launch, node.url, started + args.timeout)
            exits = {f"trainer:{i}": ended[i] for i in sorted(ended)}
            view = rpc(node.url, "tenzro_training_getRun", {"task_id": TASK_ID})
            result: dict[str, Any] = {
                "rule": json.loads(args.rule), "attack": args.attack if args.attackers else None, "value": args.value,
                "attackers": [f"trainer:{i}" for i in sorted(args.attackers)], "trainers": args.trainers,
                "quorum": args.quorum, "rounds": args.rounds, "encoding": args.encoding or "raw",
                "metadata": args.metadata or {},
                "restart_every": args.restart_every, "forget_feedback": args.forget_feedback, "restarts": restarts,
                "status": view["status"],
                "rounds_committed": len(view["round_records"]), "trainer_exit": exits,
                # Shards follow enrollment order, a race between the processes: an attacker on
                # another shard changes which honest data is missing, and so the final loss.
                "shards": dict(sorted((names[t["address"].lower()], t["shard"]) for t in view["trainers"])),
                "seconds": round(time.monotonic() - started, 1), **fragment_results(view, json.loads(args.rule), names),
            }
            if view["round_records"]:
                result["payload_bytes_per_trainer_round"] = payload_bytes(node.url, view["round_records"][0])
            last_lines = {f"trainer:{i}": c.err().strip().splitlines()[-1:] for i, c in trainers.items() if exits[f"trainer:{i}"]}
            if last_lines:
                result["trainer_last_line"] = last_lines
            models = ["--with-init"]
            if view["status"] == "Sealed":
                final = work / "final.safetensors"
                checked("train", "export-model", "--task-id", TASK_ID, "--rpc", node.url, "--out", str(final))
                models += ["--model", str(final)]
                receipt = TrainingReceipt.from_dict(rpc(node.url, "tenzro_training_getReceipt",
                                                        {"task_id": TASK_ID})["receipt"])
                payouts, dust = compute_payouts(receipt.spec.reward_pool,
                                                {t.address: t.reward_weight for t in receipt.trainers})
                result["paid_attotnzo"] = dict(sorted((names["0x" + bytes(a).hex()], str(v)) for a, v in payouts.items()))
                result["paid_back_to_sponsor_attotnzo"] = str(dust)
                verified = tenzro("train", "verify-run", "--task-id", TASK_ID, "--rpc", node.url, "--json", timeout=600)
                result["verify_run_ok"] = verified.code == 0
            evaluation = checked("train", "evaluate-model", "--spec", str(spec), *models)
            result["validation_loss"] = {("final" if m["name"] != "init_checkpoint" else "init"): m["loss"]
                                         for m in evaluation["models"]}
            result["validation_loss"].update({f"baseline {b['name']}": b["loss"] for b in evaluation["baselines"]})
        finally:
            for child in children:
                child.stop()
            node.stop()
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
