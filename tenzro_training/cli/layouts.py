"""Fragment layouts from a node's getRun or from a task's init checkpoint, and the random
outer gradients make-gradient draws over them. Used by the trainer, the node's gossip bridge
and the tests as well as by the commands."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tenzro_training.cli.exits import EXIT_RPC_ERROR, CliError
from tenzro_training.cli.files import MAX_CHECKPOINT_FILE_BYTES, checkpoint_path
from tenzro_training.errors import TenzroError


def compute_layouts_from_view(view: dict[str, Any]) -> tuple[Any, ...]:
    """The fragment layouts a node serves in getRun (``fragments``), each checked against the
    layout hash the node states for it."""
    from tenzro_training.fragments import FragmentEntry, FragmentLayout

    fragments = view.get("fragments") if isinstance(view, dict) else None
    if not isinstance(fragments, list) or not fragments:
        raise CliError("the node's getRun has no fragment layouts: pass --spec or --checkpoint", EXIT_RPC_ERROR)
    layouts = []
    try:
        for i, frag in enumerate(fragments):
            entries = tuple(
                FragmentEntry(e["name"], tuple(e["shape"]), e["dtype"], e["start"], e["stop"]) for e in frag["entries"]
            )
            layout = FragmentLayout(frag["index"], entries)
            if layout.index != i or "0x" + layout.layout_hash().hex() != frag["layout_hash"]:
                raise ValueError(f"fragment {i}: layout hash mismatch")
            layouts.append(layout)
    except (TenzroError, ValueError, TypeError, KeyError) as exc:
        raise CliError(f"the node's fragment layouts are malformed: {exc}", EXIT_RPC_ERROR) from None
    return tuple(layouts)


def compute_task_layouts(spec: Any, checkpoint: str | None = None) -> tuple[Any, ...]:
    """The task's fragment layouts: its init checkpoint (``--checkpoint`` or the spec's
    ``architecture.metadata.init_checkpoint``, hash-checked), widened to fp32, split into F
    fragments."""
    from tenzro_training.fragments import compute_fragment_layouts
    from tenzro_training.trainer.model import load_checkpoint

    ref = spec.init_checkpoint()
    if checkpoint is not None:
        path, sha = Path(checkpoint), None
    elif ref is not None:
        path, sha = checkpoint_path(ref.uri), ref.sha256
    else:
        raise CliError("the spec names no architecture.metadata.init_checkpoint: pass --checkpoint")
    if sha is None:
        import hashlib

        from storage.files import NotReadable, read_regular_file

        try:
            sha = "0x" + hashlib.sha256(read_regular_file(path, MAX_CHECKPOINT_FILE_BYTES)).hexdigest()
        except NotReadable as exc:
            raise CliError(f"cannot read checkpoint {path}: {exc.reason}") from None
    state = load_checkpoint(path, sha)  # CheckpointError (a TenzroError) -> exit 2
    # The node holds the global model in fp32 whatever architecture.dtype says, and layouts
    # (their hashes name dtypes) are computed from that fp32 state (docs/node.md).
    state = {name: t.float() for name, t in state.items()}
    return compute_fragment_layouts(state, spec.architecture.fragment_count)


def compute_random_gradient(layout: Any, seed: int, task_id: str, round_: int, scale: float) -> Any:
    """A deterministic random outer gradient for one fragment: N(0, scale^2) fp32 values drawn
    from a generator seeded by (seed, task_id, round, fragment). For tests and demos."""
    import hashlib

    import torch

    material = f"tenzro-make-gradient/{seed}/{task_id}/{round_}/{layout.index}".encode()
    gen = torch.Generator(device="cpu").manual_seed(int.from_bytes(hashlib.sha256(material).digest()[:8], "little") >> 1)
    return torch.randn(layout.numel, generator=gen, dtype=torch.float32) * scale
