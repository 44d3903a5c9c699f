"""Planning a chunked copy (the one chunker): which chunks, how large the slots are.

A chunk ``x[idx]`` is whole trailing blocks, one contiguous run of the array's
C order: bytes ``[starts[i], starts[i] + sizes[i])`` (a ``.npy`` file's offsets too).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

__all__ = ["STAGING_ALIGN", "Plan", "c_order_chunks", "plan_chunks", "split_bytes", "split_rows"]

STAGING_ALIGN = 256  # bytes: what cudaMalloc guarantees; every staging row starts on it
_SPLIT_MIN = 1 << 20  # bytes; smaller pieces of host work cost more to schedule than they gain


def c_order_chunks(shape: tuple[int, ...], itemsize: int, chunk_bytes: int) -> Iterator[tuple]:
    """Index tuples of views of at most ``max(chunk_bytes, itemsize)`` bytes covering ``shape``.

    Whole trailing blocks are grouped along the first axis that does not fit
    whole; a zero-size shape yields nothing, a 0-d one ``(Ellipsis,)``.
    """
    shape = tuple(int(n) for n in shape)
    if any(n == 0 for n in shape):
        return
    if not shape:
        yield (Ellipsis,)  # x[...] is a 0-d view; x[()] would be a scalar
        return
    limit = max(int(chunk_bytes), int(itemsize))
    block = int(itemsize)  # bytes of one step along `axis` (trailing axes whole)
    axis = len(shape) - 1
    while axis >= 0 and block * shape[axis] <= limit:
        block *= shape[axis]
        axis -= 1
    if axis < 0:  # the whole array fits in one chunk
        yield (slice(0, shape[0]),)
        return
    per = max(1, limit // block)
    for prefix in np.ndindex(*shape[:axis]):
        for start in range(0, shape[axis], per):
            yield (*prefix, slice(start, min(start + per, shape[axis])))


def chunk_shape(shape: tuple[int, ...], idx: tuple) -> tuple[int, ...]:
    """The shape of ``x[idx]`` for an index tuple of :func:`c_order_chunks`."""
    if idx == (Ellipsis,):
        return ()
    last = len(idx) - 1
    length = len(range(*idx[last].indices(shape[last])))
    return (length, *shape[last + 1 :])


def nbytes_of(shape: tuple[int, ...], itemsize: int) -> int:
    """Bytes of an array of ``shape`` (Python ints: no overflow)."""
    return math.prod(int(n) for n in shape) * int(itemsize)


def round_up(n: int, multiple: int) -> int:
    """The smallest multiple of ``multiple`` that is >= ``n``."""
    return -(-int(n) // multiple) * multiple


@dataclass(frozen=True)
class Plan:
    """A chunked copy of an array through a ring of slots."""

    chunks: list[tuple]  # index tuples in C order (c_order_chunks)
    shapes: list[tuple[int, ...]]  # each chunk's shape
    sizes: list[int]  # each chunk's bytes
    starts: list[int]  # each chunk's byte offset in the array's C order
    nbytes: int
    # a multiple of STAGING_ALIGN, at least the largest chunk and less than
    # twice it (a huge chunk_bytes never allocates more than the array needs)
    slot_bytes: int
    nslots: int  # num_buffers, or fewer when there are fewer chunks


def plan_chunks(shape: tuple[int, ...], itemsize: int, chunk_bytes: int, num_buffers: int) -> Plan:
    """Plan a copy of ``shape`` in chunks of at most ``chunk_bytes``.

    Slots: the largest chunk rounded up to a power of two (at most
    ``chunk_bytes``: a few cached ring sizes), then to 256 bytes (aligned views).
    """
    shape = tuple(int(n) for n in shape)
    chunks = list(c_order_chunks(shape, itemsize, chunk_bytes))
    shapes = [chunk_shape(shape, idx) for idx in chunks]
    sizes = [nbytes_of(s, itemsize) for s in shapes]
    starts = [0, *itertools.accumulate(sizes)][: len(sizes)]
    largest = max(sizes, default=0)
    slot = max(largest, min(1 << max(largest - 1, 0).bit_length(), int(chunk_bytes)))
    return Plan(
        chunks=chunks,
        shapes=shapes,
        sizes=sizes,
        starts=starts,
        nbytes=sum(sizes),
        slot_bytes=round_up(max(slot, 1), STAGING_ALIGN),
        nslots=max(1, min(int(num_buffers), len(chunks))),
    )


def split_rows(shape: tuple[int, ...], nbytes: int, threads: int) -> list[tuple]:
    """Index tuples covering ``shape`` once: its first axis longer than 1 in at most
    ``threads`` runs of about 1 MiB or more (one ``memcpy`` is slower than the DMA)."""
    axis = next((a for a, n in enumerate(shape) if n > 1), None)
    count = 0 if axis is None else min(threads, shape[axis], nbytes // _SPLIT_MIN)
    if axis is None or count <= 1:
        return [(...,)]
    edges = [shape[axis] * j // count for j in range(count + 1)]
    lead = (slice(None),) * axis
    return [(*lead, slice(lo, hi)) for lo, hi in itertools.pairwise(edges)]


def split_bytes(nbytes: int, threads: int, align: int = 1) -> list[tuple[int, int]]:
    """Split ``[0, nbytes)`` into at most ``threads`` ranges of at least about
    1 MiB, each starting on a multiple of ``align``."""
    count = max(1, min(threads, nbytes // _SPLIT_MIN))
    edges = [min(nbytes, round_up(nbytes * j // count, align)) for j in range(count)] + [nbytes]
    return [(lo, hi) for lo, hi in itertools.pairwise(edges) if hi > lo] or [(0, nbytes)]
