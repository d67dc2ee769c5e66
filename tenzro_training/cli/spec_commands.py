"""What a sponsor prepares before posting, and test payloads: example-spec, dataset-hash,
init-checkpoint, make-gradient."""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path

from tenzro_training.cli.client import RpcClient
from tenzro_training.cli.exits import EXIT_RPC_ERROR, EXIT_USAGE, CliError
from tenzro_training.cli.files import MAX_INPUT_FILE_BYTES, read_spec_file, read_text, write_out
from tenzro_training.cli.layouts import compute_layouts_from_view, compute_random_gradient, compute_task_layouts
from tenzro_training.cli.output import emit, kv, note


DEFAULT_DATASET_REF = "statsmodels:co2,sunspots,nile,elnino,elec_equip,macrodata"
"""trainer.data.DEFAULT_DATASET_REF, repeated so that building the parser imports no torch
(a test checks they agree)."""

EXAMPLE_SPECS: dict[str, str] = {
    "dev": "dev-task.json",
    "timesfm-200m": "timesfm-200m-task.json",
}
"""The example specs shipped in the package (``tenzro_training/data``), by ``example-spec --name``:
``dev`` posts as-is on a ``tenzro node --dev`` once ``init-checkpoint`` has named its weights (a
small model, 3 trainers, the statsmodels corpus); ``timesfm-200m`` is SPEC.md's example (another
sponsor, 1,024 rounds, an ipfs:// dataset): a template, not postable as it is."""


def cmd_example_spec(args: argparse.Namespace) -> None:
    """Write a shipped example spec where a pip user can edit it: the package's data directory is
    inside site-packages, which the docs cannot point at (packaging probe)."""
    from importlib.resources import files

    from tenzro_training.jsontext import loads_bounded
    from tenzro_training.spec import TrainingTaskSpec

    doc = loads_bounded((files("tenzro_training") / "data" / EXAMPLE_SPECS[args.name]).read_text(encoding="utf-8"))
    assert isinstance(doc, dict)
    if args.task_id is not None:
        doc["task_id"] = args.task_id
    if args.sponsor_address is not None:
        doc["sponsor_address"] = args.sponsor_address
    spec = TrainingTaskSpec.from_dict(doc)  # SpecError (exit 2, with the field) for a bad --task-id/--sponsor-address
    write_out(args.out, (json.dumps(doc, indent=2) + "\n").encode())
    result = {"out": str(args.out), "name": args.name, "task_id": spec.task_id, "sponsor_address": spec.sponsor_address,
              "spec_hash": "0x" + spec.spec_hash().hex()}
    emit(args, result, lambda r: kv(r, ["out", "name", "task_id", "sponsor_address", "spec_hash"]))


def cmd_dataset_hash(args: argparse.Namespace) -> None:
    """The ``dataset_hash`` a spec must carry for ``--dataset-ref``: what a trainer recomputes from
    the corpus it loads, and refuses to train on when it differs."""
    from tenzro_training.trainer.data import DatasetError, compute_dataset_hash, load_corpus

    try:
        corpus = load_corpus(args.dataset_ref)
    except DatasetError as exc:
        raise CliError(str(exc)) from None
    result = {"dataset_ref": args.dataset_ref, "dataset_hash": "0x" + compute_dataset_hash(corpus).hex(),
              "series": len(corpus), "points": sum(int(s.values.size) for s in corpus)}
    emit(args, result, lambda r: kv(r, ["dataset_ref", "dataset_hash", "series", "points"]))


def cmd_init_checkpoint(args: argparse.Namespace) -> None:
    """A sponsor's first step: the spec names its initial weights (URI + SHA-256) and the node
    verifies them at postTask, so they must exist before the task does."""
    from tenzro_training.jsontext import loads_bounded
    from tenzro_training.spec import TrainingTaskSpec
    from tenzro_training.trainer.model import (
        compute_checkpoint_bytes,
        config_from_spec,
        count_params,
        create_init_checkpoint,
    )

    text = read_text(args.spec, "spec")
    spec = TrainingTaskSpec.from_json(text)  # SpecError -> exit 2 with the field path
    cfg = config_from_spec(spec)  # UnknownFamily / ModelConfigError -> exit 2
    out = Path(args.out)
    data = compute_checkpoint_bytes(create_init_checkpoint(cfg, args.seed))
    write_out(str(out), data)  # as every --out: through a symlink, never over a device
    sha256 = "0x" + hashlib.sha256(data).hexdigest()
    result = {"out": str(out), "uri": out.resolve().as_uri(), "sha256": sha256, "seed": args.seed,
              "param_count": count_params(cfg)}
    if args.spec_out:
        doc = loads_bounded(text)
        assert isinstance(doc, dict)  # from_json accepted it
        doc["architecture"]["metadata"]["init_checkpoint"] = {"uri": result["uri"], "sha256": sha256}
        TrainingTaskSpec.from_dict(doc)  # still a valid spec
        write_out(args.spec_out, (json.dumps(doc, indent=2) + "\n").encode())
        result["spec_out"] = str(args.spec_out)
    if spec.architecture.param_count != result["param_count"]:
        note(f"the spec's architecture.param_count is {spec.architecture.param_count}; "
             f"the model its metadata describes has {result['param_count']}")
    emit(args, result, lambda r: kv(r, ["out", "uri", "sha256", "param_count", "spec_out"]))


def cmd_make_gradient(args: argparse.Namespace) -> None:
    from tenzro_training.payload import ENCODING_RAW, PayloadHeader, compute_payload_hash, encode_payload

    if args.round < 0:
        raise CliError("--round must be >= 0")
    if not args.scale > 0 or args.scale != args.scale:
        raise CliError("--scale must be a positive number")
    if args.spec or args.checkpoint:
        if not args.spec:
            raise CliError("--checkpoint needs --spec (for the fragment count and task id)")
        spec = read_spec_file(args.spec)
        task_id = args.task_id or spec.task_id
        layouts = compute_task_layouts(spec, args.checkpoint)
    elif args.task_id:
        task_id = args.task_id
        view = RpcClient(args.rpc).call("tenzro_training_getRun", {"task_id": task_id})
        layouts = compute_layouts_from_view(view)
    else:
        raise CliError("pass --task-id (layouts from the node's getRun) or --spec (layouts from its init checkpoint)")
    if not 0 <= args.fragment < len(layouts):
        raise CliError(f"--fragment must be in 0..{len(layouts) - 1}")
    layout = layouts[args.fragment]
    if 4 * layout.numel > MAX_INPUT_FILE_BYTES:
        # Before allocating: a node's getRun could name any size (1.3 GB for 2^27 elements, a
        # traceback from torch for 2^42). The cap is on the fp32 gradient drawn whatever --dtype:
        # an fp32 payload of it would be more than submit-gradient reads.
        raise CliError(f"fragment {layout.index} has {layout.numel} elements: its fp32 gradient would exceed "
                       f"{MAX_INPUT_FILE_BYTES} bytes, the most submit-gradient reads",
                       EXIT_USAGE if args.spec else EXIT_RPC_ERROR)
    flat = compute_random_gradient(layout, args.random_seed, task_id, args.round, args.scale)
    header = PayloadHeader(task_id, args.round, layout.index, ENCODING_RAW, layout.layout_hash())
    payload = encode_payload(header, layout, flat, args.dtype)
    write_out(args.out, payload)
    result = {
        "task_id": task_id,
        "round": args.round,
        "fragment": layout.index,
        "elements": layout.numel,
        "bytes": len(payload),
        "payload_hash": "0x" + compute_payload_hash(payload).hex(),
        "out": str(args.out),
    }
    emit(args, result, lambda r: kv(r, ["out", "task_id", "round", "fragment", "elements", "bytes", "payload_hash"]))
