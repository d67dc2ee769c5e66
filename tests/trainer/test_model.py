"""Tests for tenzro_training.trainer.model: config, forward shapes, init determinism, checkpoints."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch

import tenzro_training
from tenzro_training.errors import CheckpointError, SpecError, TenzroError
from tenzro_training.fragments import compute_model_hash
from tenzro_training.spec import TrainingTaskSpec
from tenzro_training.trainer import TrainerError
from tenzro_training.trainer.model import (
    ADAPTERS,
    CheckpointFileError,
    CheckpointHashMismatch,
    ModelConfigError,
    PatchTransformer,
    PatchTransformerConfig,
    StateMismatch,
    UnknownFamily,
    build_model,
    config_from_spec,
    count_params,
    create_init_checkpoint,
    get_adapter,
    load_checkpoint,
    load_state,
    save_checkpoint,
)

from tests.safetensors_files import relabel_dtype

EXAMPLE = json.loads((Path(tenzro_training.__file__).parent / "data" / "timesfm-200m-task.json").read_text())
TINY = PatchTransformerConfig(context_len=32, horizon=8, patch_len=8, d_model=16, n_layers=2, n_heads=2, d_ff=32)


def spec_with(metadata: dict, family: str = "timesfm") -> TrainingTaskSpec:
    doc = json.loads(json.dumps(EXAMPLE))
    doc["architecture"]["metadata"] = metadata
    doc["architecture"]["family"] = family
    return TrainingTaskSpec.from_dict(doc)


# --- config ---------------------------------------------------------------------------------


def test_config_from_example_spec_uses_tiny_defaults() -> None:
    cfg = config_from_spec(TrainingTaskSpec.from_dict(EXAMPLE))
    assert (cfg.context_len, cfg.horizon) == (2048, 128)
    assert (cfg.patch_len, cfg.d_model, cfg.n_layers, cfg.n_heads, cfg.d_ff, cfg.dropout) == (16, 32, 2, 4, 64, 0.0)
    assert cfg.n_patches == 128 and cfg.window_len == 2176


def test_config_from_spec_reads_every_field_and_integral_floats() -> None:
    meta = {"context_len": 64.0, "horizon": 16, "patch_len": 16, "d_model": 24, "n_layers": 3, "n_heads": 3,
            "d_ff": 48, "dropout": 0.1, "init_checkpoint": {"uri": "file:///x", "sha256": "0x" + "ab" * 32}}
    cfg = config_from_spec(spec_with(meta))
    assert cfg == PatchTransformerConfig(context_len=64, horizon=16, patch_len=16, d_model=24, n_layers=3,
                                         n_heads=3, d_ff=48, dropout=0.1)
    assert isinstance(cfg.context_len, int)


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"patch_len": 5}, "patch_len"),  # does not divide 32
        ({"n_heads": 3}, "n_heads"),  # does not divide 16
        ({"context_len": 0}, "context_len"),
        ({"horizon": -1}, "horizon"),
        ({"d_model": True}, "d_model"),
        ({"n_layers": 1.5}, "n_layers"),
        ({"d_ff": 10**9}, "d_ff"),
        ({"dropout": 1.0}, "dropout"),
        ({"dropout": "0.1"}, "dropout"),
        ({"dropout": False}, "dropout"),
        ({"patch_len": 64}, "patch_len"),  # longer than the context
    ],
)
def test_invalid_config(changes: dict, field: str) -> None:
    kwargs = {"context_len": 32, "horizon": 8, "patch_len": 8, "d_model": 16, "n_layers": 2, "n_heads": 2, "d_ff": 32}
    with pytest.raises(ModelConfigError) as info:
        PatchTransformerConfig(**(kwargs | changes))
    assert info.value.path == f"architecture.metadata.{field}"
    assert isinstance(info.value, SpecError) and isinstance(info.value, TrainerError)


def test_config_accepts_the_bounds_of_each_range() -> None:
    """The documented ranges are inclusive: a one-value patch, one head per channel, a patch as
    long as the context and the largest sizes are legal specs, which a node must not refuse."""
    smallest = PatchTransformerConfig(context_len=1, horizon=1, patch_len=1, d_model=1, n_layers=1, n_heads=1,
                                      d_ff=1, dropout=0)
    assert smallest.n_patches == 1 and smallest.dropout == 0.0 and type(smallest.dropout) is float
    largest = PatchTransformerConfig(context_len=65_536, horizon=65_536, patch_len=65_536, d_model=16_384,
                                     n_layers=256, n_heads=16_384, d_ff=65_536)
    assert largest.n_patches == 1 and largest.window_len == 131_072
    for field, value in (("context_len", 65_537), ("horizon", 65_537), ("d_model", 16_385), ("n_layers", 257),
                         ("d_ff", 65_537)):
        with pytest.raises(ModelConfigError) as info:
            PatchTransformerConfig(**{"context_len": 32, "horizon": 8, "patch_len": 8} | {field: value})
        assert info.value.path == f"architecture.metadata.{field}"


def test_invalid_config_says_the_allowed_range() -> None:
    """A sponsor fixing a spec needs the actual bound: a patch cannot exceed the context, a
    block cannot have more heads than channels."""
    with pytest.raises(ModelConfigError, match=r"integer in \[1, 32\], got 64"):
        PatchTransformerConfig(context_len=32, horizon=8, patch_len=64)
    with pytest.raises(ModelConfigError, match=r"integer in \[1, 16\], got 32"):
        PatchTransformerConfig(context_len=32, horizon=8, patch_len=8, d_model=16, n_heads=32)


def test_invalid_config_from_spec_missing_horizon() -> None:
    with pytest.raises(ModelConfigError) as info:
        config_from_spec(spec_with({"context_len": 32}))
    assert info.value.path == "architecture.metadata.horizon"


def test_invalid_family() -> None:
    with pytest.raises(UnknownFamily) as info:
        config_from_spec(spec_with({"context_len": 32, "horizon": 8}, family="llama"))
    assert info.value.path == "architecture.family"
    # The sponsor is told which families this node can train.
    with pytest.raises(UnknownFamily, match=r"known: \['timesfm'\]"):
        get_adapter("llama")


def test_registry() -> None:
    adapter = get_adapter("timesfm")
    assert ADAPTERS["timesfm"] is adapter and adapter.family == "timesfm" == TINY.family
    assert adapter.count_params(TINY) == count_params(TINY)


# --- forward --------------------------------------------------------------------------------


def test_forward_and_loss_shapes() -> None:
    model = build_model(TINY)
    load_state(model, create_init_checkpoint(TINY, 0))
    windows = torch.randn(5, TINY.window_len, generator=torch.Generator().manual_seed(1))
    assert model(windows[:, :32]).shape == (5, 8)
    assert model.forward_normalised(windows[:, :32]).shape == (5, 8)
    loss = model.loss(windows)
    assert loss.shape == () and torch.isfinite(loss)


def test_forecast_is_equivariant_to_affine_rescaling() -> None:
    # Instance normalisation: forecasting a*x + b gives a*f(x) + b, so scale never matters.
    model = build_model(TINY)
    load_state(model, create_init_checkpoint(TINY, 3))
    x = torch.randn(4, 32, generator=torch.Generator().manual_seed(2), dtype=torch.float64).float()
    with torch.no_grad():
        base, scaled = model(x), model(x * 250.0 + 1000.0)
    assert torch.allclose(scaled, base * 250.0 + 1000.0, rtol=1e-4, atol=1e-2)


def test_forecast_reads_the_most_recent_patch() -> None:
    """A forecaster must react to the latest values: reordering only the last patch (same mean
    and spread, so the same normalisation) changes the forecast."""
    model = build_model(TINY)
    load_state(model, create_init_checkpoint(TINY, 3))
    x = torch.randn(2, 32, generator=torch.Generator().manual_seed(6))
    y = torch.cat([x[:, :24], x[:, 24:].flip(-1)], dim=1)
    with torch.no_grad():
        assert not torch.allclose(model(x), model(y))


def test_loss_is_mse_on_context_normalised_targets() -> None:
    model = build_model(TINY)
    load_state(model, create_init_checkpoint(TINY, 4))
    w = torch.randn(3, 40, generator=torch.Generator().manual_seed(5)) * 7 + 300
    ctx, tgt = w[:, :32], w[:, 32:]
    mu, sd = ctx.mean(1, keepdim=True), ctx.std(1, unbiased=False, keepdim=True)
    with torch.no_grad():
        pred = model(ctx)
        want = (((pred - mu) / sd - (tgt - mu) / sd) ** 2).mean()
        assert torch.allclose(model.loss(w), want, rtol=1e-4)


def test_flat_context_does_not_blow_up() -> None:
    model = build_model(TINY)
    load_state(model, create_init_checkpoint(TINY, 0))
    w = torch.full((2, 40), 5.0)
    w[:, 32:] = 6.0
    with torch.no_grad():
        loss = model.loss(w)
    assert torch.isfinite(loss) and float(loss) < 10.0  # scale 1 is used, target is 1 unit away


# --- init checkpoint ------------------------------------------------------------------------


def test_init_checkpoint_is_deterministic_and_leaves_global_rng_alone() -> None:
    before = torch.get_rng_state()
    a, b = create_init_checkpoint(TINY, 7), create_init_checkpoint(TINY, 7)
    model = build_model(TINY)
    assert torch.equal(torch.get_rng_state(), before)
    assert list(a) == sorted(a) == sorted(model.state_dict())
    assert all(torch.equal(a[k], b[k]) and a[k].dtype == torch.float32 for k in a)
    assert compute_model_hash(a) == compute_model_hash(b)
    assert compute_model_hash(create_init_checkpoint(TINY, 8)) != compute_model_hash(a)


def test_init_values_follow_the_documented_rule() -> None:
    s = create_init_checkpoint(TINY, 0)
    assert torch.count_nonzero(s["layers.0.qkv.bias"]) == 0
    assert torch.equal(s["layers.1.norm2.weight"], torch.ones(16)) and torch.equal(s["norm.weight"], torch.ones(16))
    assert 0.01 < float(s["layers.0.qkv.weight"].std()) < 0.03
    # Residual outputs scaled by 1/sqrt(2 * n_layers): 0.02 / 2 = 0.01 here.
    assert all(0.0085 < float(s[f"layers.{i}.{n}.weight"].std()) < 0.0115 for i in (0, 1) for n in ("fc2", "proj"))


def test_count_params_matches_the_module() -> None:
    torch.manual_seed(0)
    module = PatchTransformer(TINY)
    expected = sum(p.numel() for p in module.parameters())
    assert count_params(TINY) == expected == sum(t.numel() for t in create_init_checkpoint(TINY, 0).values())


@pytest.mark.parametrize("seed", [-1, 2**63, True, 1.0])
def test_invalid_seed(seed: object) -> None:
    with pytest.raises(TrainerError):
        create_init_checkpoint(TINY, seed)  # type: ignore[arg-type]


def test_invalid_state_for_model() -> None:
    state = create_init_checkpoint(TINY, 0)
    model = build_model(TINY)
    with pytest.raises(StateMismatch):
        load_state(model, {k: v for k, v in state.items() if k != "head.bias"})
    with pytest.raises(StateMismatch):
        load_state(model, state | {"head.bias": torch.zeros(9)})
    with pytest.raises(StateMismatch):
        load_state(model, state | {"extra": torch.zeros(1)})


def test_state_mismatch_names_five_tensors_then_counts() -> None:
    """A refusal must say which tensors differ, yet stay readable for a model of thousands of
    tensors: five names of each kind, then how many more."""
    state = create_init_checkpoint(TINY, 0)
    names = sorted(state)
    model = build_model(TINY)
    with pytest.raises(StateMismatch) as five:
        load_state(model, {k: v for k, v in state.items() if k not in names[:5]})
    assert str(five.value).endswith("missing: " + ", ".join(names[:5]))
    with pytest.raises(StateMismatch) as six:
        load_state(model, {k: v for k, v in state.items() if k not in names[:6]})
    assert str(six.value).endswith("missing: " + ", ".join(names[:5]) + " and 1 more")


def test_bf16_state_loads_widened() -> None:
    state = {k: v.to(torch.bfloat16) for k, v in create_init_checkpoint(TINY, 0).items()}
    model = build_model(TINY)
    load_state(model, state)
    assert torch.equal(model.state_dict()["head.weight"], state["head.weight"].float())


# --- checkpoint files -----------------------------------------------------------------------


def test_checkpoint_round_trip_and_sha256(tmp_path: Path) -> None:
    state = create_init_checkpoint(TINY, 11)
    path = tmp_path / "init.safetensors"
    sha = save_checkpoint(state, path)
    assert sha == "0x" + hashlib.sha256(path.read_bytes()).hexdigest()
    # Same state -> same bytes -> same hash (the sponsor and the node agree without coordination).
    assert save_checkpoint(create_init_checkpoint(TINY, 11), tmp_path / "again.safetensors") == sha
    loaded = load_checkpoint(path, sha)
    assert loaded.keys() == state.keys() and all(torch.equal(loaded[k], state[k]) for k in state)
    assert load_checkpoint(path, sha.upper().replace("0X", "0x")).keys() == state.keys()
    assert load_checkpoint(path, bytes.fromhex(sha[2:])).keys() == state.keys()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["again.safetensors", "init.safetensors"]


def test_checkpoint_hash_is_the_spec_init_checkpoint(tmp_path: Path) -> None:
    path = tmp_path / "init.safetensors"
    sha = save_checkpoint(create_init_checkpoint(TINY, 1), path, metadata={"family": "timesfm"})
    spec = spec_with({"context_len": 32, "horizon": 8, "init_checkpoint": {"uri": path.as_uri(), "sha256": sha}})
    ref = spec.init_checkpoint()
    assert ref is not None and ref.sha256 == sha
    assert compute_model_hash(load_checkpoint(path, ref.sha256)) == compute_model_hash(create_init_checkpoint(TINY, 1))


def test_checkpoint_bytes_do_not_depend_on_metadata_order(tmp_path: Path) -> None:
    """safetensors writes metadata in hash-map order (20 saves of one state gave 20 different
    files); save_checkpoint sorts it, and leaves a file with one key as the library wrote it."""
    import json
    import struct

    import safetensors
    import safetensors.torch

    state = create_init_checkpoint(TINY, 3)
    metadata = {key: f"value {i} \u00e9" for i, key in enumerate(["zeta", "alpha", "mu", "beta", "omega", "k"])}
    hashes = {save_checkpoint(state, tmp_path / f"c{i}.safetensors", metadata=metadata) for i in range(8)}
    assert len(hashes) == 1
    data = (tmp_path / "c0.safetensors").read_bytes()
    n = struct.unpack("<Q", data[:8])[0]
    assert n % 8 == 0 and list(json.loads(data[8 : 8 + n])["__metadata__"]) == sorted(metadata)
    with safetensors.safe_open(str(tmp_path / "c0.safetensors"), "pt") as f:
        assert f.metadata() == metadata
    assert load_checkpoint(tmp_path / "c0.safetensors", hashes.pop()).keys() == state.keys()
    # Two keys are already enough for the library's order to vary.
    two = {"zeta": "1", "alpha": "2"}
    assert len({save_checkpoint(state, tmp_path / f"t{i}.safetensors", metadata=two) for i in range(8)}) == 1
    data = (tmp_path / "t0.safetensors").read_bytes()
    assert list(json.loads(data[8 : 8 + struct.unpack("<Q", data[:8])[0]])["__metadata__"]) == ["alpha", "zeta"]
    save_checkpoint(state, tmp_path / "one.safetensors", metadata={"family": "timesfm"})
    assert (tmp_path / "one.safetensors").read_bytes() == safetensors.torch.save(
        {k: v.contiguous() for k, v in state.items()}, metadata={"family": "timesfm"})


def test_invalid_tampered_checkpoint_rejected(tmp_path: Path) -> None:
    path = tmp_path / "init.safetensors"
    sha = save_checkpoint(create_init_checkpoint(TINY, 2), path)
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x01  # one bit of the last weight
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointHashMismatch) as info:
        load_checkpoint(path, sha)
    err = info.value
    assert err.expected == sha and err.actual == "0x" + hashlib.sha256(bytes(data)).hexdigest()
    assert isinstance(err, CheckpointError) and isinstance(err, TrainerError) and isinstance(err, TenzroError)


def test_invalid_checkpoint_not_safetensors(tmp_path: Path) -> None:
    path = tmp_path / "junk.safetensors"
    path.write_bytes(b"\xff" * 64)
    with pytest.raises(CheckpointFileError) as info:
        load_checkpoint(path, hashlib.sha256(b"\xff" * 64).digest())
    assert not isinstance(info.value, CheckpointHashMismatch)


@pytest.mark.parametrize(("dtype", "per_fp32"), [("F8_E8M0", 4), ("F4", 8)])
def test_invalid_checkpoint_of_a_dtype_torch_lacks(tmp_path: Path, dtype: str, per_fp32: int) -> None:
    """safetensors' reader accepts these dtypes and its torch loader raises a bare KeyError,
    which reached `tenzro` as a crash instead of the checkpoint error (exit 2) it is."""
    import safetensors.torch

    data = relabel_dtype(safetensors.torch.save({"w": torch.zeros(2)}), "w", dtype, per_fp32)
    path = tmp_path / "odd.safetensors"
    path.write_bytes(data)
    with pytest.raises(CheckpointFileError, match=f"not a safetensors file: .*{dtype}"):
        load_checkpoint(path, hashlib.sha256(data).digest())


@pytest.mark.parametrize("expected", ["0x1234", "zz" * 32, b"short", 5, "0x" + "ab" * 33])
def test_invalid_expected_digest(tmp_path: Path, expected: object) -> None:
    """A malformed expected digest is the spec's fault, not a tampered file: it must not be
    reported as a hash mismatch."""
    path = tmp_path / "init.safetensors"
    save_checkpoint(create_init_checkpoint(TINY, 0), path)
    with pytest.raises(CheckpointFileError, match="expected sha256 must be") as info:
        load_checkpoint(path, expected)  # type: ignore[arg-type]
    assert not isinstance(info.value, CheckpointHashMismatch)


def test_invalid_missing_checkpoint(tmp_path: Path) -> None:
    with pytest.raises(CheckpointFileError):
        load_checkpoint(tmp_path / "absent.safetensors", "0x" + "00" * 32)


def test_invalid_checkpoint_that_is_a_fifo_is_refused_at_once(tmp_path: Path) -> None:
    """A spec's file:// checkpoint read with read_bytes blocked on a FIFO until a writer came."""
    import os

    os.mkfifo(tmp_path / "init.safetensors")
    with pytest.raises(CheckpointFileError, match="not a regular file"):
        load_checkpoint(tmp_path / "init.safetensors", "0x" + "00" * 32)
