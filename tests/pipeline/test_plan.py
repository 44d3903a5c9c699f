"""Planning a chunked copy: chunks in C order, slot sizes, splits for threads."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from interop.pipeline.plan import (
    STAGING_ALIGN,
    c_order_chunks,
    plan_chunks,
    split_bytes,
    split_rows,
)


@pytest.mark.parametrize(
    ("shape", "chunk"),
    [((5, 7), 56), ((5, 7), 24), ((5, 7), 10_000), ((2, 3, 4), 8), ((2, 3, 4), 1), ((9,), 20)],
)
def test_chunks_cover_c_order_within_the_limit(shape, chunk):
    a = np.arange(int(np.prod(shape)), dtype=np.int64).reshape(shape)
    chunks = list(c_order_chunks(shape, 8, chunk))
    assert np.concatenate([a[i].reshape(-1) for i in chunks]).tolist() == list(range(a.size))
    assert all(a[i].nbytes <= max(chunk, 8) for i in chunks)
    assert all(np.shares_memory(a[i], a) for i in chunks)  # views, not copies


def test_chunks_of_0d_and_zero_size():
    assert list(c_order_chunks((), 4, 1)) == [(Ellipsis,)]
    assert list(c_order_chunks((3, 0), 4, 1)) == []


@pytest.mark.parametrize(
    ("shape", "itemsize", "chunk"),
    [((7, 5, 3), 8, 300), ((1000,), 16, 65544), ((3, 4000), 2, 70_000), ((), 8, 1), ((1,), 1, 1)],
)
def test_plan_offsets_shapes_and_slots(shape, itemsize, chunk):
    plan = plan_chunks(shape, itemsize, chunk, 4)
    a = np.empty(shape, f"V{itemsize}")
    assert [a[i].shape for i in plan.chunks] == plan.shapes
    assert plan.sizes == [a[i].nbytes for i in plan.chunks]
    assert plan.starts == [sum(plan.sizes[:i]) for i in range(len(plan.sizes))]
    assert plan.nbytes == a.nbytes
    # every staging row (k * slot_bytes) starts aligned for any element type
    assert plan.slot_bytes % STAGING_ALIGN == 0
    assert plan.slot_bytes >= max(plan.sizes)
    assert plan.nslots == min(4, len(plan.chunks))


def test_slots_never_exceed_twice_what_the_array_needs():
    """A huge chunk_bytes never becomes a huge slot: a slot is the largest
    chunk rounded up to a power of two (so rings are shared), or 256 bytes."""
    assert plan_chunks((10,), 8, 1 << 30, 4).slot_bytes == STAGING_ALIGN
    assert plan_chunks((3000,), 8, 1 << 30, 4).slot_bytes == 32768  # 24000 needed
    assert plan_chunks((3000,), 8, 24100, 4).slot_bytes == 24320  # capped by the chunk size
    assert plan_chunks((1 << 20,), 1, 1 << 16, 4).slot_bytes == 1 << 16
    assert plan_chunks((1 << 20,), 1, 1 << 40, 2).slot_bytes == 1 << 20


def test_slot_sizes_are_shared_across_array_sizes():
    """Power-of-two slots (up to the chunk size): arrays of many sizes share rings."""
    sizes = {plan_chunks((n,), 1, 1 << 20, 4).slot_bytes for n in range(300_000, 500_000, 7919)}
    assert sizes == {1 << 19}


@pytest.mark.parametrize(
    ("shape", "nbytes", "threads", "count"),
    [
        ((64, 1024), 64 << 20, 4, 4),  # split along the first axis
        ((1, 1, 300, 7), 8 << 20, 3, 3),  # leading axes of 1 skipped
        ((3, 10), 64 << 20, 8, 3),  # at most one piece per row
        ((64, 1024), 1 << 20, 4, 1),  # small chunks are not split
        ((), 8, 4, 1),
        ((1, 1), 8, 4, 1),
    ],
)
def test_split_rows_cover_each_element_once(shape, nbytes, threads, count):
    hits = np.zeros(shape, np.int64)
    pieces = split_rows(shape, nbytes, threads)
    for piece in pieces:
        hits[piece] += 1
    assert len(pieces) == count
    assert (hits == 1).all()


@pytest.mark.parametrize(
    ("nbytes", "threads", "align", "count"),
    [
        (8 << 20, 4, 8, 4),
        (3 << 20, 8, 16, 3),
        (100, 4, 1, 1),
        (0, 4, 1, 1),
        ((5 << 20) + 3, 2, 4, 2),
    ],
)
def test_split_bytes_cover_the_range_once_on_aligned_starts(nbytes, threads, align, count):
    ranges = split_bytes(nbytes, threads, align)
    assert len(ranges) == count
    assert ranges[0][0] == 0
    assert ranges[-1][1] == nbytes
    assert all(hi == lo for (_, hi), (lo, _) in itertools.pairwise(ranges))
    assert all(lo % align == 0 for lo, _ in ranges)


@pytest.mark.parametrize(
    "index",
    [
        (...,),
        (slice(None, None, -2), slice(1, 8, 3)),
        (3,),
        (slice(None), 2),
        (slice(None, None, -1),),
    ],
    ids=["whole", "negative-and-step", "row", "column", "reversed"],
)
@pytest.mark.parametrize("transpose", [False, True], ids=["c", "t"])
def test_byte_extent_covers_exactly_the_bytes_a_strided_view_uses(index, transpose):
    """A cross-device copy moves these bytes in one DMA and views them with the
    source's strides: they must be the view's own bounds, no more, no less."""
    from numpy.lib.array_utils import byte_bounds

    from interop.pipeline.cuda import byte_extent

    base = np.arange(7 * 9 * 5, dtype=np.complex128).reshape(7, 9, 5)
    view = (base.T if transpose else base)[index]
    lo, span = byte_extent(view.shape, view.strides, view.itemsize)
    low, high = byte_bounds(view)
    assert (lo, span) == (low - view.ctypes.data, high - low)
    start = low - base.ctypes.data
    raw = base.reshape(-1).view(np.uint8)[start : start + span].copy()
    again = np.ndarray(view.shape, view.dtype, raw.data, -lo, view.strides)
    np.testing.assert_array_equal(again, view)
