"""Real timeseries for the trainers: the corpus, its hash, the time split and the shard rule.

What this module is: :func:`load_corpus` reads real series from the CSV files shipped inside the
statsmodels package (nothing is downloaded); :func:`compute_dataset_hash` commits to the corpus
(the task's ``dataset_hash``); :func:`shard_windows` deals the training windows to
``shard_count`` trainers, disjointly and deterministically; :func:`validation_batch` builds the
held-out evaluation windows (:func:`get_validation_windows` names them); :data:`SEASON_LENGTHS`
gives each source's seasonal period, for the seasonal-naive baseline. The exact encodings and
rules are in docs/trainer.md, "Data".

What it is NOT: no model code, no networking, no download. The CSVs are parsed here with the
standard library (``csv`` + ``float``, which rounds correctly) rather than with pandas, so the
values, and therefore the dataset hash, do not depend on a pandas version's float parser.

``dataset_ref`` names a corpus: ``"statsmodels:"`` followed by comma-separated source names, in
corpus order, e.g. :data:`DEFAULT_DATASET_REF`. Sources (statsmodels dataset, series):

* ``co2``: Mauna Loa weekly CO2, 1958-2001, 2284 points; 59 missing weeks filled by linear
  interpolation between the neighbouring observations;
* ``sunspots``: yearly sunspot activity 1700-2008, 309 points;
* ``nile``: yearly Nile volume at Aswan 1871-1970, 100 points;
* ``elnino``: monthly sea surface temperature 1950-2010, the 61 x 12 table read row by row
  (732 points);
* ``elec_equip``: monthly EU electrical equipment orders 1995-2016, 257 points;
* ``macrodata``: 12 quarterly US macro series 1959-2009 (203 points each), named
  ``macrodata.<column>`` in file column order.
"""

from __future__ import annotations

import csv
import functools
import hashlib
import importlib.util
import io
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from tenzro_training.trainer import TrainerError

__all__ = [
    "DATASET_HASH_DOMAIN",
    "DATASET_REF_SCHEME",
    "DEFAULT_DATASET_REF",
    "DEFAULT_HOLDOUT_BPS",
    "SEASON_LENGTHS",
    "SHARD_KEY_DOMAIN",
    "SOURCES",
    "DatasetError",
    "Series",
    "Shard",
    "ShardError",
    "check_shardable",
    "WindowRef",
    "compute_dataset_hash",
    "compute_dataset_ref",
    "compute_train_length",
    "get_season_length",
    "get_training_windows",
    "get_validation_windows",
    "load_corpus",
    "parse_dataset_ref",
    "shard_windows",
    "validate_dataset_hash",
    "validation_batch",
]

DATASET_REF_SCHEME = "statsmodels"
DATASET_HASH_DOMAIN = b"tenzro/train/dataset/v1"
SHARD_KEY_DOMAIN = b"tenzro/train/shard/v1"
DEFAULT_HOLDOUT_BPS = 2000
"""The last 20% (basis points, rounded up) of every series is held out for validation."""


class DatasetError(TrainerError, ValueError):
    """A dataset_ref, corpus file or dataset hash is invalid."""


class ShardError(TrainerError, ValueError):
    """Windows cannot be sharded as asked (bad index/count, too few windows, ...)."""


def _u64(value: int) -> bytes:
    return struct.pack(">Q", value)


# --- values ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, eq=False)
class Series:
    """One named timeseries of the corpus."""

    name: str
    """Unique name, e.g. ``"co2"`` or ``"macrodata.realgdp"``."""
    values: np.ndarray
    """1-D float32, oldest first, read-only, no NaN."""


@dataclass(frozen=True, slots=True, order=True)
class WindowRef:
    """A window: ``window_len`` consecutive values of series ``series`` from ``start``."""

    series: int
    """Index of the series in the corpus."""
    start: int
    """First value's position in the series."""


@dataclass(frozen=True, slots=True, eq=False)
class Shard:
    """The training windows dealt to trainer ``index`` of ``count``."""

    index: int
    """Shard index, 0 <= index < count (the trainer's enrolled shard index)."""
    count: int
    """Number of shards (the task's trainer_count M)."""
    refs: tuple[WindowRef, ...]
    """The shard's windows in canonical order (series, start)."""
    windows: torch.Tensor
    """``(len(refs), context_len + horizon)`` float32: row i is window ``refs[i]``."""

    def __len__(self) -> int:
        return len(self.refs)


# --- sources --------------------------------------------------------------------------------


def _datasets_dir() -> Path:
    # find_spec locates the package without importing it (statsmodels.datasets imports pandas).
    spec = importlib.util.find_spec("statsmodels")
    if spec is None or not spec.submodule_search_locations:
        raise DatasetError("the statsmodels package (which ships the corpus files) is not installed")
    return Path(next(iter(spec.submodule_search_locations))) / "datasets"


def _read_rows(name: str) -> tuple[list[str], list[list[str]]]:
    path = _datasets_dir() / name / f"{name}.csv"
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise DatasetError(f"cannot read {path}: {exc.strerror or exc}") from exc
    rows = [row for row in csv.reader(io.StringIO(text)) if row]
    return rows[0], rows[1:]


def _column(name: str, rows: list[list[str]], index: int) -> list[float | None]:
    # An empty cell is a missing value; anything else must parse (float() rounds correctly).
    try:
        return [float(row[index]) if row[index].strip() else None for row in rows]
    except (ValueError, IndexError) as exc:
        raise DatasetError(f"{name}: malformed CSV cell ({exc})") from exc


def _fill_linear(name: str, values: list[float | None]) -> list[float]:
    """Fill interior gaps by linear interpolation, in float64: y0 + (y1 - y0) * (i - i0) / (i1 - i0)."""
    known = [(i, v) for i, v in enumerate(values) if v is not None]
    if not known or known[0][0] != 0 or known[-1][0] != len(values) - 1:
        raise DatasetError(f"{name}: the first and last values must be present")
    out: list[float] = []
    for (i0, y0), (i1, y1) in zip(known, known[1:]):
        out.extend(y0 + (y1 - y0) * (i - i0) / (i1 - i0) for i in range(i0, i1))
    return out + [known[-1][1]]


def _series(name: str, values: Sequence[float | None]) -> Series:
    if any(v is None for v in values):
        raise DatasetError(f"{name}: unexpected missing values")
    arr = np.asarray(values, dtype=np.float64).astype(np.float32)
    if not np.isfinite(arr).all():
        raise DatasetError(f"{name}: non-finite values")
    arr.flags.writeable = False
    return Series(name, arr)


def _load_column(source: str, column: str, *, fill: bool = False) -> tuple[Series, ...]:
    header, rows = _read_rows(source)
    values = _column(source, rows, header.index(column))
    return (_series(source, _fill_linear(source, values) if fill else values),)


def _load_elnino() -> tuple[Series, ...]:
    header, rows = _read_rows("elnino")
    columns = [_column("elnino", rows, m) for m in range(1, 13)]  # JAN..DEC
    # Read row-major (year by year, then month): the table becomes the monthly series.
    flat = [columns[m][r] for r in range(len(rows)) for m in range(12)]
    return (_series("elnino", flat),)


def _load_macrodata() -> tuple[Series, ...]:
    header, rows = _read_rows("macrodata")
    return tuple(
        _series(f"macrodata.{col}", _column("macrodata", rows, i))
        for i, col in enumerate(header)
        if col not in ("year", "quarter")
    )


SOURCES: dict[str, Callable[[], tuple[Series, ...]]] = {
    "co2": functools.partial(_load_column, "co2", "co2", fill=True),
    "sunspots": functools.partial(_load_column, "sunspots", "SUNACTIVITY"),
    "nile": functools.partial(_load_column, "nile", "volume"),
    "elnino": _load_elnino,
    "elec_equip": functools.partial(_load_column, "elec_equip", "STS.M.I7.W.TOVT.NS0016.4.000"),
    "macrodata": _load_macrodata,
}
"""Source name -> loader of its series (in the order they join the corpus)."""

SEASON_LENGTHS: dict[str, int] = {
    "co2": 52,  # weekly: a year is 52 weeks (52.18; the naive rule needs a whole number)
    "sunspots": 1,  # yearly: no calendar season (the ~11-year solar cycle is not a fixed period)
    "nile": 1,  # yearly
    "elnino": 12,  # monthly
    "elec_equip": 12,  # monthly
    "macrodata": 4,  # quarterly
}
"""Source name -> observations per seasonal cycle (1: none). Used only by the seasonal-naive
baseline of :mod:`.evaluation`, where a season of 1 makes it the last-value forecast (the usual
convention for non-seasonal series); nothing the protocol hashes or shards depends on it."""

DEFAULT_DATASET_REF = "statsmodels:co2,sunspots,nile,elnino,elec_equip,macrodata"


# --- the corpus -----------------------------------------------------------------------------


def parse_dataset_ref(ref: str) -> tuple[str, ...]:
    """``"statsmodels:a,b"`` -> ``("a", "b")``; DatasetError for another scheme, an unknown or
    repeated source, or an empty list."""
    scheme, sep, rest = ref.partition(":") if isinstance(ref, str) else ("", "", "")
    if scheme != DATASET_REF_SCHEME or not sep:
        raise DatasetError(f"dataset_ref must start with {DATASET_REF_SCHEME!r}:, got {ref!r:.80}")
    names = tuple(rest.split(","))
    unknown = [n for n in names if n not in SOURCES]
    if unknown:
        raise DatasetError(f"dataset_ref names unknown sources {unknown[:5]!r:.120} (known: {sorted(SOURCES)})")
    if len(set(names)) != len(names):
        raise DatasetError(f"dataset_ref repeats a source: {ref!r:.80}")
    return names


def compute_dataset_ref(sources: Sequence[str]) -> str:
    """The ``dataset_ref`` string naming ``sources`` in this order (validated)."""
    ref = f"{DATASET_REF_SCHEME}:{','.join(sources)}"
    parse_dataset_ref(ref)
    return ref


@functools.lru_cache(maxsize=8)
def load_corpus(ref: str = DEFAULT_DATASET_REF) -> tuple[Series, ...]:
    """The series named by ``ref``, sources in ref order, each source's series in file order.

    Cached per ref (the arrays are read-only, so sharing them is safe).
    """
    return tuple(series for name in parse_dataset_ref(ref) for series in SOURCES[name]())


def get_season_length(series: Series) -> int:
    """The seasonal period of ``series``, from its source (``"macrodata.cpi"`` -> ``macrodata``)."""
    return SEASON_LENGTHS[series.name.partition(".")[0]]


def compute_dataset_hash(corpus: Sequence[Series]) -> bytes:
    """SHA-256(b"tenzro/train/dataset/v1" || u64 count || per series: u64 name length, UTF-8 name,
    u64 length, float32 little-endian values). Integers are big-endian (as docs/fragments.md)."""
    h = hashlib.sha256(DATASET_HASH_DOMAIN)
    h.update(_u64(len(corpus)))
    for series in corpus:
        raw = series.name.encode("utf-8")
        h.update(_u64(len(raw)) + raw + _u64(len(series.values)))
        h.update(np.ascontiguousarray(series.values, dtype="<f4").tobytes())
    return h.digest()


def validate_dataset_hash(corpus: Sequence[Series], expected: str | bytes) -> None:
    """Raise DatasetError unless the corpus hashes to ``expected`` (``0x`` + hex, or 32 bytes)."""
    actual = compute_dataset_hash(corpus)
    try:
        want = expected if isinstance(expected, bytes) else bytes.fromhex(str(expected).removeprefix("0x"))
    except ValueError as exc:
        raise DatasetError(f"expected dataset hash {expected!r:.80} is not hex") from exc
    if actual != want:
        raise DatasetError(f"dataset hash is 0x{actual.hex()}, the task expects 0x{want.hex()}")


# --- split and windows ----------------------------------------------------------------------


def compute_train_length(n: int, holdout_bps: int = DEFAULT_HOLDOUT_BPS) -> int:
    """Values of an ``n``-point series used for training: ``n - ceil(n * holdout_bps / 10000)``."""
    return n - (n * holdout_bps + 9999) // 10000


def _check_window_args(context_len: int, horizon: int, stride: int, holdout_bps: int) -> None:
    for name, value, lo in (("context_len", context_len, 1), ("horizon", horizon, 1), ("stride", stride, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < lo:
            raise ShardError(f"{name} must be an integer >= {lo}, got {value!r}")
    if isinstance(holdout_bps, bool) or not isinstance(holdout_bps, int) or not 0 < holdout_bps < 10000:
        raise ShardError(f"holdout_bps must be an integer in (0, 10000), got {holdout_bps!r}")


def get_training_windows(
    corpus: Sequence[Series], window_len: int, *, stride: int = 1, holdout_bps: int = DEFAULT_HOLDOUT_BPS
) -> tuple[WindowRef, ...]:
    """Every training window in canonical order: series by series, starts ``0, stride, ...`` while
    the whole window lies in the series' training part. Series that are too short give none."""
    refs = []
    for i, series in enumerate(corpus):
        train_len = compute_train_length(len(series.values), holdout_bps)
        refs.extend(WindowRef(i, s) for s in range(0, train_len - window_len + 1, stride))
    return tuple(refs)


def _shard_key(seed: bytes, series: Series, start: int) -> bytes:
    raw = series.name.encode("utf-8")
    return hashlib.sha256(SHARD_KEY_DOMAIN + _u64(len(seed)) + seed + _u64(len(raw)) + raw + _u64(start)).digest()


def _gather(corpus: Sequence[Series], refs: Sequence[WindowRef], window_len: int) -> torch.Tensor:
    out = np.empty((len(refs), window_len), dtype=np.float32)
    for row, ref in enumerate(refs):
        out[row] = corpus[ref.series].values[ref.start : ref.start + window_len]
    return torch.from_numpy(out)


def _check_shard_count(shard_count: int) -> None:
    if isinstance(shard_count, bool) or not isinstance(shard_count, int) or shard_count < 1:
        raise ShardError(f"shard_count must be an integer >= 1, got {shard_count!r}")


def _check_fills(windows: int, shard_count: int) -> None:
    if windows < shard_count:
        raise ShardError(f"{windows} training windows cannot fill {shard_count} shards")


def check_shardable(
    corpus: Sequence[Series], shard_count: int, context_len: int, horizon: int, *, stride: int = 1,
    holdout_bps: int = DEFAULT_HOLDOUT_BPS,
) -> None:
    """ShardError unless :func:`shard_windows` can deal ``shard_count`` non-empty shards: what a
    trainer checks before it enrolls, when its shard index is not known yet (the window list
    only: no hashing, no sort, no windows gathered)."""
    _check_window_args(context_len, horizon, stride, holdout_bps)
    _check_shard_count(shard_count)
    _check_fills(len(get_training_windows(corpus, context_len + horizon, stride=stride, holdout_bps=holdout_bps)),
                 shard_count)


def shard_windows(
    corpus: Sequence[Series],
    shard_index: int,
    shard_count: int,
    context_len: int,
    horizon: int,
    *,
    stride: int = 1,
    holdout_bps: int = DEFAULT_HOLDOUT_BPS,
    seed: bytes = b"",
) -> Shard:
    """Trainer ``shard_index``'s training windows (docs/trainer.md, "Sharding").

    Rule: list every training window (:func:`get_training_windows`), sort them by
    ``SHA-256(domain || u64 len(seed) || seed || u64 len(name) || name || u64 start)`` (ties,
    impossible in practice, by series and start), and give the window at sorted position p to
    shard ``p mod shard_count``. Shards are therefore disjoint, cover every window, differ in
    size by at most one, and are a seeded pseudo-random mix of all series and times.
    """
    _check_window_args(context_len, horizon, stride, holdout_bps)
    _check_shard_count(shard_count)
    if isinstance(shard_index, bool) or not isinstance(shard_index, int) or not 0 <= shard_index < shard_count:
        raise ShardError(f"shard_index must be an integer in [0, {shard_count}), got {shard_index!r}")
    if not isinstance(seed, bytes):
        raise ShardError("seed must be bytes")
    window_len = context_len + horizon
    refs = get_training_windows(corpus, window_len, stride=stride, holdout_bps=holdout_bps)
    _check_fills(len(refs), shard_count)
    ranked = sorted(refs, key=lambda r: (_shard_key(seed, corpus[r.series], r.start), r))
    mine = tuple(sorted(ranked[shard_index::shard_count]))
    return Shard(shard_index, shard_count, mine, _gather(corpus, mine, window_len))


def get_validation_windows(
    corpus: Sequence[Series], context_len: int, horizon: int, *, holdout_bps: int = DEFAULT_HOLDOUT_BPS
) -> tuple[WindowRef, ...]:
    """The held-out windows :func:`validation_batch` gathers, in its row order: per series,
    targets tile the held-out tail in non-overlapping blocks of ``horizon`` (context may reach
    back into the training part); starts are ``train_len - context_len + k * horizon``. Windows
    that would start before the series or end after it are skipped."""
    _check_window_args(context_len, horizon, 1, holdout_bps)
    window_len = context_len + horizon
    refs = []
    for i, series in enumerate(corpus):
        n = len(series.values)
        first = compute_train_length(n, holdout_bps) - context_len
        refs.extend(WindowRef(i, s) for s in range(first, n - window_len + 1, horizon) if s >= 0)
    if not refs:
        raise ShardError(f"no series is long enough for a validation window of {window_len} values")
    return tuple(refs)


def validation_batch(
    corpus: Sequence[Series], context_len: int, horizon: int, *, holdout_bps: int = DEFAULT_HOLDOUT_BPS
) -> torch.Tensor:
    """Held-out windows ``(n, context_len + horizon)``: row i is window i of
    :func:`get_validation_windows`."""
    refs = get_validation_windows(corpus, context_len, horizon, holdout_bps=holdout_bps)
    return _gather(corpus, refs, context_len + horizon)
