"""Tests for tenzro_training.trainer.data: the real corpus, its hash, the split and the shard rule."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import tenzro_training
from tenzro_training.spec import TrainingTaskSpec
from tenzro_training.trainer import TrainerError
from tenzro_training.trainer.data import (
    DEFAULT_DATASET_REF,
    SEASON_LENGTHS,
    SOURCES,
    DatasetError,
    Series,
    ShardError,
    WindowRef,
    check_shardable,
    compute_dataset_hash,
    compute_dataset_ref,
    compute_train_length,
    get_season_length,
    get_training_windows,
    get_validation_windows,
    load_corpus,
    parse_dataset_ref,
    shard_windows,
    validate_dataset_hash,
    validation_batch,
)

MACRO = [
    "realgdp", "realcons", "realinv", "realgovt", "realdpi", "cpi", "m1", "tbilrate", "unemp", "pop", "infl", "realint"
]
# Pinned: changes only if the corpus files, the source order or the documented encoding change.
DEFAULT_DATASET_HASH = "0xa338b632e57671843f4eec915e05f65deea78dff8c5612c6aa182db5fedd4b17"


@pytest.fixture(scope="module")
def corpus() -> tuple[Series, ...]:
    return load_corpus()


def sm_frame(name: str):  # type: ignore[no-untyped-def]
    """statsmodels' own pandas loader for one dataset (an independent reading of the same CSV)."""
    import importlib
    import warnings

    module = importlib.import_module(f"statsmodels.datasets.{name}")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # pandas deprecation noise inside statsmodels
        return module.load_pandas().data


def synthetic(lengths: list[int]) -> tuple[Series, ...]:
    return tuple(Series(f"s{i}", np.arange(n, dtype=np.float32) + 1000 * i) for i, n in enumerate(lengths))


# --- corpus ---------------------------------------------------------------------------------


def test_corpus_is_the_real_statsmodels_data(corpus: tuple[Series, ...]) -> None:
    names = [s.name for s in corpus]
    assert names == ["co2", "sunspots", "nile", "elnino", "elec_equip"] + [f"macrodata.{c}" for c in MACRO]
    lengths = {s.name: len(s.values) for s in corpus}
    assert (lengths["co2"], lengths["sunspots"], lengths["nile"], lengths["elnino"], lengths["elec_equip"]) == (
        2284, 309, 100, 732, 257)
    assert all(lengths[f"macrodata.{c}"] == 203 for c in MACRO)
    by = {s.name: s.values for s in corpus}
    f32 = np.float32
    assert by["co2"][0] == f32(316.1) and by["co2"][-1] == f32(371.5)  # March 1958, December 2001
    assert by["sunspots"][:3].tolist() == [5.0, 11.0, 16.0]
    assert by["nile"][0] == 1120.0 and by["nile"][-1] == 740.0
    assert by["elnino"][0] == f32(23.11) and by["elnino"][12] == f32(24.19)  # Jan 1950, Jan 1951
    assert by["macrodata.realgdp"][0] == f32(2710.349)
    for s in corpus:
        assert s.values.dtype == np.float32 and s.values.ndim == 1 and np.isfinite(s.values).all()
        assert not s.values.flags.writeable


def test_co2_gaps_are_linearly_interpolated(corpus: tuple[Series, ...]) -> None:
    # The raw file has 59 empty weeks; each filled value lies on the line between the nearest
    # observed neighbours, computed in float64 and rounded once to float32 (the documented rule).
    raw = sm_frame("co2")["co2"].to_numpy()
    missing = np.flatnonzero(np.isnan(raw))
    known = np.flatnonzero(~np.isnan(raw))
    assert len(missing) == 59 and missing.min() > 0 and missing.max() < len(raw) - 1
    co2 = corpus[0].values
    assert np.array_equal(co2[known], raw[known].astype(np.float32))
    for i in missing:
        i0, i1 = known[known < i].max(), known[known > i].min()
        y0, y1 = float(raw[i0]), float(raw[i1])
        assert co2[i] == np.float32(y0 + (y1 - y0) * (i - i0) / (i1 - i0))


def test_corpus_equals_statsmodels_own_loaders(corpus: tuple[Series, ...]) -> None:
    # Our stdlib CSV reader must agree with statsmodels' pandas loaders value for value.
    by = {s.name: s.values for s in corpus}
    as32 = lambda x: np.asarray(x, dtype=np.float64).astype(np.float32)  # noqa: E731
    assert np.array_equal(by["co2"], as32(sm_frame("co2")["co2"].interpolate(method="linear")))
    assert np.array_equal(by["sunspots"], as32(sm_frame("sunspots")["SUNACTIVITY"]))
    assert np.array_equal(by["nile"], as32(sm_frame("nile")["volume"]))
    assert np.array_equal(by["elnino"], as32(sm_frame("elnino").iloc[:, 1:]).reshape(-1))
    assert np.array_equal(by["elec_equip"], as32(sm_frame("elec_equip").iloc[:, 0]))
    macro = sm_frame("macrodata")
    for c in MACRO:
        assert np.array_equal(by[f"macrodata.{c}"], as32(macro[c]))


@pytest.fixture
def datasets_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty stand-in for statsmodels' datasets directory: a test writes the files it needs."""
    import tenzro_training.trainer.data as data

    monkeypatch.setattr(data, "_datasets_dir", lambda: tmp_path)
    return tmp_path


@pytest.mark.parametrize(("text", "message"), [
    ("year,volume\n1871,1120\n1872,\n1873,963\n", "nile: unexpected missing values"),
    ("year,volume\n1871,1120\n1872\n", "nile: malformed CSV cell"),
    ("year,volume\n1871,1120\n1872,lots\n", "nile: malformed CSV cell"),
], ids=["missing-value", "short-row", "not-a-number"])
def test_invalid_corpus_file_is_a_dataset_error(datasets_dir: Path, text: str, message: str) -> None:
    """A damaged or altered statsmodels install must be refused as a DatasetError naming the
    source (what a trainer reports before it stakes), never as a stray TypeError or IndexError."""
    (datasets_dir / "nile").mkdir()
    (datasets_dir / "nile" / "nile.csv").write_text(text)
    with pytest.raises(DatasetError, match=message):
        SOURCES["nile"]()


def test_unreadable_corpus_file_is_a_dataset_error(datasets_dir: Path) -> None:
    (datasets_dir / "nile" / "nile.csv").mkdir(parents=True)  # a directory where the file should be
    with pytest.raises(DatasetError, match="cannot read .*nile.csv"):
        SOURCES["nile"]()


def test_without_statsmodels_the_corpus_is_a_dataset_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """The corpus files ship inside statsmodels: without it the trainer says so."""
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *args: None if name == "statsmodels" else real(name, *args))
    with pytest.raises(DatasetError, match="statsmodels package .* is not installed"):
        SOURCES["nile"]()


def test_corpus_subset_follows_ref_order() -> None:
    sub = load_corpus("statsmodels:nile,co2")
    assert [s.name for s in sub] == ["nile", "co2"]
    assert load_corpus("statsmodels:nile,co2") is sub  # cached


# --- dataset ref and hash -------------------------------------------------------------------


def test_dataset_ref_round_trip_and_spec_accepts_it(corpus: tuple[Series, ...]) -> None:
    sources = parse_dataset_ref(DEFAULT_DATASET_REF)
    assert sources == ("co2", "sunspots", "nile", "elnino", "elec_equip", "macrodata")
    assert compute_dataset_ref(sources) == DEFAULT_DATASET_REF
    doc = json.loads((Path(tenzro_training.__file__).parent / "data" / "timesfm-200m-task.json").read_text())
    doc["dataset_ref"] = DEFAULT_DATASET_REF
    doc["dataset_hash"] = "0x" + compute_dataset_hash(corpus).hex()
    spec = TrainingTaskSpec.from_dict(doc)
    validate_dataset_hash(load_corpus(spec.dataset_ref), spec.dataset_hash)


@pytest.mark.parametrize(
    "ref", ["ipfs://Qm", "statsmodels", "statsmodels:", "statsmodels:co2,co2", "statsmodels:co2,gasoline",
            "Statsmodels:co2", "statsmodels:co2,", 42],
)
def test_invalid_dataset_ref(ref: object) -> None:
    with pytest.raises(DatasetError) as info:
        parse_dataset_ref(ref)  # type: ignore[arg-type]
    assert isinstance(info.value, ValueError)  # a bad argument, for callers that catch ValueError


def test_invalid_dataset_ref_names_the_unknown_sources() -> None:
    """The sponsor fixes a ref by the names the error gives: the scheme is only the part before
    the first colon, the rest are the source names as written."""
    with pytest.raises(DatasetError, match=r"unknown sources \['co2:x'\]"):
        parse_dataset_ref("statsmodels:co2:x")
    with pytest.raises(DatasetError, match=r"unknown sources \['x', 'y'\]"):  # every one, not only the first
        parse_dataset_ref("statsmodels:co2,x,y")


def test_dataset_hash_pinned(corpus: tuple[Series, ...]) -> None:
    assert "0x" + compute_dataset_hash(corpus).hex() == DEFAULT_DATASET_HASH
    validate_dataset_hash(corpus, DEFAULT_DATASET_HASH)
    validate_dataset_hash(corpus, bytes.fromhex(DEFAULT_DATASET_HASH[2:]))


def test_dataset_hash_encoding_by_hand() -> None:
    import hashlib

    s = (Series("ab", np.array([1.0, -2.5], dtype=np.float32)),)
    body = (b"tenzro/train/dataset/v1" + (1).to_bytes(8, "big") + (2).to_bytes(8, "big") + b"ab"
            + (2).to_bytes(8, "big") + bytes.fromhex("0000803f000020c0"))
    assert compute_dataset_hash(s) == hashlib.sha256(body).digest()


def test_invalid_dataset_hash_changes(corpus: tuple[Series, ...]) -> None:
    reordered = corpus[1:] + corpus[:1]
    assert compute_dataset_hash(reordered) != compute_dataset_hash(corpus)
    tweaked = list(corpus)
    values = corpus[2].values.copy()
    values[5] = np.nextafter(values[5], np.float32(np.inf))  # one ulp
    tweaked[2] = Series("nile", values)
    with pytest.raises(DatasetError):
        validate_dataset_hash(tweaked, DEFAULT_DATASET_HASH)
    with pytest.raises(DatasetError):
        validate_dataset_hash(corpus, "0xnothex")


# --- split and shards -----------------------------------------------------------------------


def test_train_length_rounds_the_holdout_up() -> None:
    assert compute_train_length(100) == 80
    assert compute_train_length(2284) == 2284 - 457  # ceil(456.8)
    assert compute_train_length(203, 1000) == 182  # ceil(20.3) = 21 held out


@pytest.mark.parametrize("count", [1, 3, 8])
def test_shards_are_disjoint_covering_and_balanced(corpus: tuple[Series, ...], count: int) -> None:
    everything = set(get_training_windows(corpus, 40))
    shards = [shard_windows(corpus, i, count, 32, 8) for i in range(count)]
    seen: set[WindowRef] = set()
    for shard in shards:
        assert shard.index < shard.count == count
        assert not seen & set(shard.refs)
        seen |= set(shard.refs)
        assert list(shard.refs) == sorted(shard.refs)
    assert seen == everything
    sizes = [len(s) for s in shards]
    assert max(sizes) - min(sizes) <= 1 and sum(sizes) == len(everything) == 4225


def test_shard_windows_are_training_slices(corpus: tuple[Series, ...]) -> None:
    shard = shard_windows(corpus, 1, 3, 32, 8)
    assert shard.windows.shape == (len(shard), 40) and shard.windows.dtype == torch.float32
    for row in (0, len(shard) // 2, len(shard) - 1):
        ref = shard.refs[row]
        values = corpus[ref.series].values
        assert ref.start + 40 <= compute_train_length(len(values))  # never touches held-out data
        assert np.array_equal(shard.windows[row].numpy(), values[ref.start : ref.start + 40])
    # A seeded shuffle, not contiguous blocks: every shard sees many series.
    assert len({r.series for r in shard.refs}) >= 10


def test_shards_are_deterministic_and_seeded(corpus: tuple[Series, ...]) -> None:
    a, b = shard_windows(corpus, 0, 4, 32, 8), shard_windows(corpus, 0, 4, 32, 8)
    assert a.refs == b.refs and torch.equal(a.windows, b.windows)
    c = shard_windows(corpus, 0, 4, 32, 8, seed=b"task-42")
    assert c.refs != a.refs
    assert shard_windows(corpus, 0, 4, 32, 8, stride=4).refs != a.refs


def test_shard_rule_encoding_by_hand() -> None:
    """The node and every trainer must deal the same windows to the same shard index, whatever
    implementation each runs (docs/trainer.md "Sharding"): the sort key is pinned byte for byte
    here, as the dataset hash is above, and so are the defaults (stride 1, empty seed)."""
    import hashlib

    corpus = synthetic([20, 15])  # 16 and 12 training values: 7 and 3 windows of 10
    seed = b"task-7"

    def key(name: str, start: int) -> bytes:
        return hashlib.sha256(b"tenzro/train/shard/v1" + len(seed).to_bytes(8, "big") + seed
                              + len(name).to_bytes(8, "big") + name.encode() + start.to_bytes(8, "big")).digest()

    windows = [WindowRef(i, start) for i, n in enumerate((7, 3)) for start in range(n)]
    assert get_training_windows(corpus, 10) == tuple(windows)
    ranked = sorted(windows, key=lambda r: key(corpus[r.series].name, r.start))
    for index in range(3):
        assert shard_windows(corpus, index, 3, 6, 4, seed=seed).refs == tuple(sorted(ranked[index::3]))
    assert shard_windows(corpus, 1, 3, 6, 4).refs == shard_windows(corpus, 1, 3, 6, 4, seed=b"").refs
    assert len(shard_windows(corpus, 0, 1, 6, 4)) == 10
    check_shardable(corpus, 10, 6, 4)  # ten windows fill ten shards


@settings(max_examples=40, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 60), min_size=1, max_size=5),
    count=st.integers(1, 6),
    stride=st.integers(1, 3),
    seed=st.binary(max_size=4),
)
def test_shard_rule_property(lengths: list[int], count: int, stride: int, seed: bytes) -> None:
    corpus = synthetic(lengths)
    windows = get_training_windows(corpus, 10, stride=stride)
    if len(windows) < count:
        with pytest.raises(ShardError):
            shard_windows(corpus, 0, count, 6, 4, stride=stride, seed=seed)
        with pytest.raises(ShardError):
            check_shardable(corpus, count, 6, 4, stride=stride)
        return
    check_shardable(corpus, count, 6, 4, stride=stride)  # the trainer's pre-enrollment check agrees
    shards = [shard_windows(corpus, i, count, 6, 4, stride=stride, seed=seed) for i in range(count)]
    refs = [r for s in shards for r in s.refs]
    assert sorted(refs) == sorted(windows) and len(set(refs)) == len(refs)
    assert max(map(len, shards)) - min(map(len, shards)) <= 1
    for s in shards:
        for ref, row in zip(s.refs, s.windows):
            assert row[0].item() == corpus[ref.series].values[ref.start]


@pytest.mark.parametrize(
    ("index", "count", "ctx", "horizon"),
    [(3, 3, 32, 8), (-1, 3, 32, 8), (0, 0, 32, 8), (0, True, 32, 8), (0, 3, 0, 8), (0, 3, 32, 0),
     (0, 10**6, 32, 8), (0, 1, 5000, 8)],
)
def test_invalid_shard_arguments(corpus: tuple[Series, ...], index: int, count: int, ctx: int, horizon: int) -> None:
    with pytest.raises(ShardError) as info:
        shard_windows(corpus, index, count, ctx, horizon)
    assert isinstance(info.value, TrainerError) and isinstance(info.value, ValueError)
    if 0 <= index < 3:  # every argument check but the index (unknown before enrollment)
        with pytest.raises(ShardError):
            check_shardable(corpus, count, ctx, horizon)


def test_invalid_holdout_and_seed(corpus: tuple[Series, ...]) -> None:
    with pytest.raises(ShardError):
        shard_windows(corpus, 0, 1, 32, 8, holdout_bps=0)
    with pytest.raises(ShardError):
        shard_windows(corpus, 0, 1, 32, 8, seed="text")  # type: ignore[arg-type]
    with pytest.raises(ShardError):
        validation_batch(corpus, 4000, 8)


# --- validation windows ---------------------------------------------------------------------


def test_validation_targets_are_held_out(corpus: tuple[Series, ...]) -> None:
    val = validation_batch(corpus, 32, 8)
    assert val.shape[1] == 40 and val.dtype == torch.float32
    co2 = corpus[0].values
    t = compute_train_length(len(co2))
    # First co2 window: context ends exactly where the held-out tail starts.
    assert np.array_equal(val[0].numpy(), co2[t - 32 : t + 8])
    expected = 0
    for s in corpus:
        n, tl = len(s.values), compute_train_length(len(s.values))
        expected += len([x for x in range(tl - 32, n - 40 + 1, 8) if x >= 0])
    assert val.shape[0] == expected == 150


def test_validation_windows_name_the_rows_of_the_validation_batch(corpus: tuple[Series, ...]) -> None:
    refs = get_validation_windows(corpus, 32, 8)
    val = validation_batch(corpus, 32, 8)
    assert len(refs) == len(val) == 150 and list(refs) == sorted(refs)
    for ref, row in zip(refs, val):
        assert np.array_equal(row.numpy(), corpus[ref.series].values[ref.start : ref.start + 40])


def test_a_validation_window_may_start_at_the_first_value() -> None:
    """A series just long enough for one window, its context reaching back to its very first
    value, still gives that held-out window (20 values: 16 train, context 16, horizon 4)."""
    corpus = synthetic([20])
    assert get_validation_windows(corpus, 16, 4) == (WindowRef(0, 0),)
    assert validation_batch(corpus, 16, 4)[0].tolist() == list(range(20))


def test_every_source_has_a_season(corpus: tuple[Series, ...]) -> None:
    assert set(SEASON_LENGTHS) == set(SOURCES)
    seasons = {s.name: get_season_length(s) for s in corpus}
    assert (seasons["co2"], seasons["elnino"], seasons["nile"], seasons["macrodata.cpi"]) == (52, 12, 1, 4)


def test_validation_and_training_targets_never_overlap() -> None:
    corpus = synthetic([100, 57])  # values encode (series, position) uniquely
    train = torch.cat([shard_windows(corpus, 0, 1, 12, 4).windows[:, 12:].reshape(-1)])
    val = validation_batch(corpus, 12, 4)[:, 12:].reshape(-1)
    assert not set(train.tolist()) & set(val.tolist())


def test_the_shipped_dev_example_is_trainable_on_its_dataset() -> None:
    """tenzro_training/data/dev-task.json names a corpus a trainer loads (statsmodels, shipped
    in a PyPI package), with its true hash, enough windows for every trainer's shard, and a
    model its param_count describes: what `tenzro trainer run` checks before it enrolls."""
    from tenzro_training.spec import TrainingTaskSpec
    from tenzro_training.trainer.data import check_shardable, compute_dataset_hash, load_corpus
    from tenzro_training.trainer.model import config_from_spec, count_params

    spec = TrainingTaskSpec.from_json((Path(tenzro_training.__file__).parent / "data" / "dev-task.json").read_text())
    corpus = load_corpus(spec.dataset_ref)
    assert "0x" + compute_dataset_hash(corpus).hex() == spec.dataset_hash
    model = config_from_spec(spec)
    check_shardable(corpus, spec.trainer_count, model.context_len, model.horizon)
    assert count_params(model) == spec.architecture.param_count
