"""Chunked tensor kernels behind ``aggregation``: comparator networks and the exact Krum Gram.

What this module is: the fast, bit-exact arithmetic of the aggregation rules over K rows of N
coordinates, written as a fixed sequence of elementwise torch operations on cache-sized column
chunks, plus the construction of the comparator networks those kernels run. Every operation is
elementwise (IEEE-754 exact per element) or a batched matrix product whose every sum is exact, so
the results do not depend on the chunk size, the thread count or the CPU's vector width.
``docs/aggregation.md`` states the arithmetic each kernel implements.

What it is NOT: the rules' API, validation or report (``aggregation`` checks shapes, dtypes,
finiteness and the rule before calling in here; the kernels trust their arguments), and no I/O.

Why chunks: a per-coordinate sort (``torch.sort`` / ``torch.median`` over dim 0) costs 10-20x
a copy of the inputs. A comparator network needs only ``min``/``max`` per pair of rows; run on
column chunks of ~1-4 MiB in total, the K rows stay in cache, so main memory sees each input
once. Elementwise ops use torch's intra-op threads (both cores) without changing any result.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import NamedTuple

import torch

__all__ = [
    "Comparator",
    "GRAM_BLOCK",
    "GRAM_BITS",
    "compute_sorting_network",
    "compute_pruned_network",
    "compute_chunk_size",
    "mean_into",
    "median_into",
    "trimmed_mean_into",
    "block_grams_into",
    "compute_tree_sum",
]

GRAM_BLOCK = 512
"""Coordinates per Krum Gram block: each block's Gram is computed exactly (docs/aggregation.md)."""
GRAM_BITS = 22
"""Each block row is rounded to a multiple of 2^(e - GRAM_BITS), |x| < 2^e: |x / ulp| <= 2^22.

With B = 512 = 2^9 terms of at most 2^44 each, every partial sum of a block's dot product is an
integer multiple of the block's unit below 2^53, hence exact in float64 in ANY summation order:
BLAS may block, thread or vectorise the products however it likes and still return the same bits.
"""

# float64 bits of the rounding constant M = 1.5 * 2^(52 + g), g = e - GRAM_BITS: its float64
# biased exponent is e - 22 + 52 + 1023 = (e + 126) + _MAGIC_EXPONENT_OFFSET, with e + 126 in 0..255.
_MAGIC_EXPONENT_OFFSET = 1023 + 52 - 126 - GRAM_BITS
_MAGIC_MANTISSA = 1 << 51


class Comparator(NamedTuple):
    """One compare-exchange: afterwards row ``lo`` holds min(lo, hi) and row ``hi`` max(lo, hi).

    ``need_lo`` / ``need_hi`` say whether a later comparator or a wanted output reads that result;
    a pruned network computes only those.
    """

    lo: int
    hi: int
    need_lo: bool
    need_hi: bool


NETWORK_CACHE_SIZE = 64
"""Networks kept per function. A run's rule and trainer count fix its few (k, outputs) keys;
unbounded, a sponsor varying trainer counts and trims kept every network ever built (up to
480 KB each at k = 256: soak probe)."""


@functools.lru_cache(maxsize=NETWORK_CACHE_SIZE)
def compute_sorting_network(k: int) -> tuple[tuple[int, int], ...]:
    """Batcher's odd-even merge sort on k wires, as (lo, hi) pairs with lo < hi, in order.

    Built for the next power of two and restricted to wires < k: a comparator touching a wire
    >= k would compare against +infinity (a no-op), so dropping it keeps the network sorting.
    """
    if k < 1:
        raise ValueError(f"a sorting network needs k >= 1, got {k}")
    size = 1
    while size < k:
        size *= 2
    pairs: list[tuple[int, int]] = []
    p = 1
    while p < size:
        step = p
        while step >= 1:
            for j in range(step % p, size - step, 2 * step):
                for i in range(min(step, size - j - step)):
                    a, b = i + j, i + j + step
                    if a // (2 * p) == b // (2 * p) and b < k:
                        pairs.append((a, b))
            step //= 2
        p *= 2
    return tuple(pairs)


@functools.lru_cache(maxsize=NETWORK_CACHE_SIZE)
def compute_pruned_network(k: int, outputs: tuple[int, ...]) -> tuple[Comparator, ...]:
    """The sorting network on k wires reduced to what the sorted positions ``outputs`` need.

    Walking backwards from the wanted outputs, a comparator is kept if either of its results is
    read later; a kept comparator whose other result is never read becomes a single min or max.
    """
    needed = set(outputs)
    kept: list[Comparator] = []
    for lo, hi in reversed(compute_sorting_network(k)):
        need_lo, need_hi = lo in needed, hi in needed
        if need_lo or need_hi:
            kept.append(Comparator(lo, hi, need_lo, need_hi))
            needed.update((lo, hi))
    kept.reverse()
    return tuple(kept)


def compute_chunk_size(rows: int, itemsize: int, budget: int = 4 << 20, align: int = 4096) -> int:
    """Columns per chunk so that ``rows`` rows of ``itemsize`` bytes fit about ``budget`` bytes.

    Only speed depends on it (the kernels' results do not). Clamped to 16Ki..256Ki columns: below
    that torch's per-call overhead dominates, above it the rows leave the cache.
    """
    columns = budget // (rows * itemsize)
    columns = max(16 * 1024, min(256 * 1024, columns))
    return max(align, columns // align * align)


def _chunks(n: int, chunk: int) -> range:
    return range(0, n, chunk)


# --- Mean ------------------------------------------------------------------------------------


def mean_into(rows: Sequence[torch.Tensor], out: torch.Tensor) -> None:
    """out = (((x0 + x1) + x2) + ... + x_{K-1}) / K, each step one float32 operation.

    ``rows``: K 1-D contiguous tensors (float32/float16/bfloat16, converted exactly to float32);
    ``out``: a 1-D float32 tensor of the same length. The explicit left-to-right order (torch's
    own reductions would reorder the sum) is what makes the result reproducible.
    """
    k = len(rows)
    n = out.numel()
    chunk = compute_chunk_size(2, 4, budget=2 << 20)
    for s in _chunks(n, chunk):
        e = min(n, s + chunk)
        acc = out[s:e]
        acc.copy_(rows[0][s:e])
        for row in rows[1:]:
            acc.add_(row[s:e])
        if k > 1:
            acc.div_(k)


# --- order statistics --------------------------------------------------------------------------


class _Pool:
    """Scratch rows for one chunk: a comparator writes into a free row or over a dead input."""

    def __init__(self, count: int, chunk: int, dtype: torch.dtype) -> None:
        self._buffers = [torch.empty(chunk, dtype=dtype) for _ in range(count)]

    def views(self, n: int) -> list[torch.Tensor]:
        return [b[:n] for b in self._buffers]


def _run_network(
    cur: list[torch.Tensor | None], owned: list[bool], free: list[torch.Tensor],
    network: Sequence[Comparator],
) -> None:
    """Apply ``network`` to the rows ``cur`` in place (as Python references; inputs never written).

    ``owned[i]`` says whether ``cur[i]`` is a scratch row (which may be overwritten) rather than a
    view of a caller's input. Two torch calls per full comparator: min into a free row, max over
    an owned operand (an elementwise op may write over one of its own inputs).
    """
    minimum, maximum = torch.minimum, torch.maximum
    for lo, hi, need_lo, need_hi in network:
        a, b = cur[lo], cur[hi]
        own_a, own_b = owned[lo], owned[hi]
        if need_lo and need_hi:
            low = free.pop()
            minimum(a, b, out=low)
            if own_b:
                high = b
            elif own_a:
                high = a
            else:
                high = free.pop()
            maximum(a, b, out=high)
            if own_a and high is not a:
                free.append(a)
            cur[lo], cur[hi] = low, high
            owned[lo] = owned[hi] = True
        else:
            # Only one result is read later: compute it over an owned operand, drop the other.
            op, keep = (minimum, lo) if need_lo else (maximum, hi)
            if own_a:
                dst = a
            elif own_b:
                dst = b
            else:
                dst = free.pop()
            op(a, b, out=dst)
            if own_a and own_b:
                free.append(b)
            cur[keep], owned[keep] = dst, True
            dead = hi if need_lo else lo
            cur[dead], owned[dead] = None, False


def _sorted_chunks(rows: Sequence[torch.Tensor], outputs: tuple[int, ...], n: int):
    """Yield (start, end, cur) per chunk, ``cur[i]`` for i in ``outputs`` = the i-th smallest."""
    k = len(rows)
    network = compute_pruned_network(k, outputs)
    # min and max only select values, so the network may run in the inputs' own dtype when they
    # all share it (16-bit rows: half the cache traffic); mixed dtypes meet in float32.
    dtypes = {row.dtype for row in rows}
    dtype = dtypes.pop() if len(dtypes) == 1 else torch.float32
    chunk = compute_chunk_size(k + 2, dtype.itemsize)
    pool = _Pool(k + 2, min(chunk, max(n, 1)), dtype)
    for s in _chunks(n, chunk):
        e = min(n, s + chunk)
        cur: list[torch.Tensor | None] = [row[s:e] for row in rows]
        owned = [False] * k
        free = pool.views(e - s)
        _run_network(cur, owned, free, network)
        yield s, e, cur


def median_into(rows: Sequence[torch.Tensor], out: torch.Tensor) -> None:
    """out = per-coordinate median of the K rows, written as documented in docs/aggregation.md.

    Odd K: the middle value. Even K: the two middle values a <= b, their exact midpoint rounded
    once to float32 (computed as float64 (a + b) * 0.5: the sum of two float32 values is exact in
    float64 unless their exponents differ by > 29, and double rounding through float64 is
    innocuous for float32 results of +, so this equals round32((a + b) / 2) and cannot overflow).
    Either way a zero result is +0.0 (``x + 0.0`` maps -0.0 to +0.0 and leaves the rest).
    """
    k = len(rows)
    n = out.numel()
    if k % 2:
        mid = k // 2
        for s, e, cur in _sorted_chunks(rows, (mid,), n):
            torch.add(cur[mid], 0.0, out=out[s:e])
        return
    lo_i, hi_i = k // 2 - 1, k // 2
    wide = torch.empty(min(n, compute_chunk_size(k + 2, 2)), dtype=torch.float64)
    for s, e, cur in _sorted_chunks(rows, (lo_i, hi_i), n):
        w = wide[: e - s]
        w.copy_(cur[lo_i])
        w.add_(cur[hi_i])
        torch.mul(w, 0.5, out=out[s:e])
        # After the rounding to float32, not before: the midpoint of a negative subnormal and a
        # zero rounds to -0.0 (found by the hypothesis reference test).
        out[s:e].add_(0.0)


def trimmed_mean_into(rows: Sequence[torch.Tensor], out: torch.Tensor, t: int) -> None:
    """out = (kept_0 + kept_1 + ... ) / (K - 2t) in float32, kept = sorted values t..K-t-1.

    The kept values are summed left to right in ascending order (one float32 add each), then one
    float32 division; a zero result is +0.0. Requires K - 2t >= 1 (the caller checks).
    """
    k = len(rows)
    n = out.numel()
    kept = tuple(range(t, k - t))
    count = len(kept)
    for s, e, cur in _sorted_chunks(rows, kept, n):
        acc = out[s:e]
        if count == 1:
            torch.add(cur[kept[0]], 0.0, out=acc)
            continue
        first, second = cur[kept[0]], cur[kept[1]]
        if first.dtype == torch.float32 and second.dtype == torch.float32:
            torch.add(first, second, out=acc)
        else:  # 16-bit rows: an out-of-place add would round in 16 bits, so widen first
            acc.copy_(first)
            acc.add_(second)
        for i in kept[2:]:
            acc.add_(cur[i])
        acc.div_(count)
        acc.add_(0.0)


# --- Krum: exact block Gram matrices -------------------------------------------------------------


def block_grams_into(rows: Sequence[torch.Tensor], out: torch.Tensor) -> None:
    """out[b, i, j] = exact dot product of rounded rows i and j over block b (+0.0 for zero).

    Block b covers coordinates [512 b, 512 b + 512) (the last block zero-padded). In each block,
    row i is rounded to the nearest (ties to even) multiple of 2^(e_ib - 22), where e_ib is the
    least integer >= -126 with |x| < 2^e_ib for every x of row i in the block (for float32 data:
    the largest biased exponent field E in the block, minus 126). ``out`` is float64
    [>= nblocks, K, K]; rows past the last block are left untouched.
    """
    k = len(rows)
    n = rows[0].numel()
    chunk = compute_chunk_size(k, 8, budget=8 << 20, align=GRAM_BLOCK)
    chunk = min(chunk, -(-max(n, 1) // GRAM_BLOCK) * GRAM_BLOCK)
    wide = torch.empty(chunk // GRAM_BLOCK, k, GRAM_BLOCK, dtype=torch.float64)
    for s in _chunks(n, chunk):
        e = min(n, s + chunk)
        size = e - s
        nb = -(-size // GRAM_BLOCK)
        full = size // GRAM_BLOCK
        rem = size - full * GRAM_BLOCK
        w = wide[:nb]
        for i, row in enumerate(rows):  # float32/16-bit -> float64 is exact
            x = row[s:e]
            if full:
                w[:full, i, :].copy_(x[: full * GRAM_BLOCK].view(full, GRAM_BLOCK))
            if rem:
                w[full, i, :rem].copy_(x[full * GRAM_BLOCK :])
                w[full, i, rem:].zero_()
        # Separate amax and amin: torch.aminmax over a minor dimension is ~20x slower here.
        largest = torch.maximum(w.amax(dim=2), w.amin(dim=2).neg_())  # [nb, K]
        # frexp: largest = f * 2^e with 0.5 <= f < 1, so largest < 2^e is tight; the floor at
        # 2^-130 makes all-zero blocks behave like subnormal ones (e = -126, float32's E = 0).
        exponent = torch.frexp(largest.clamp_(min=2.0**-130)).exponent.clamp_(min=-126)
        magic_bits = (exponent.to(torch.int64) + _MAGIC_EXPONENT_OFFSET + 126) << 52
        magic = (magic_bits | _MAGIC_MANTISSA).view(torch.float64).unsqueeze(2)  # [nb, K, 1]
        # (x + M) - M rounds x to a multiple of 2^g: x + M lies in [2^(52+g), 2^(53+g)), whose
        # float64 spacing is exactly 2^g, and |x| < 2^(g+22) keeps it there.
        w.add_(magic).sub_(magic)
        b0 = s // GRAM_BLOCK
        torch.bmm(w, w.transpose(1, 2), out=out[b0 : b0 + nb])
    # An exact zero may come back as -0.0 or +0.0 depending on the BLAS's order: pin +0.0.
    out.add_(0.0)


def compute_tree_sum(values: torch.Tensor) -> torch.Tensor:
    """Pairwise sum over dim 0 with a fixed shape: pad to a power of two with zeros, then halve.

    ``values[:h] + values[h:]`` repeatedly, each an elementwise float64 add, so the result is the
    same on any thread count. Returns a tensor shaped ``values.shape[1:]``.
    """
    count = values.shape[0]
    size = 1
    while size < count:
        size *= 2
    if size != count:
        values = torch.cat([values, values.new_zeros((size - count, *values.shape[1:]))])
    else:
        values = values.clone()
    while size > 1:
        size //= 2
        values[:size].add_(values[size : 2 * size])
    return values[0].clone()
