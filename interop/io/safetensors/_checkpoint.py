"""How :mod:`interop.io.safetensors` moves tensors: its arguments checked, tensors
that share memory found, one progress over many transfers, a file written
(each tensor at its offset: device data through the staging ring, host data
from its own memory) and read (mapped copy-on-write, or each tensor filled
through :func:`~interop.io._format.move`).
"""

from __future__ import annotations

import bisect
import itertools
import math
import mmap
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from ... import _backends, dtypes
from ...arrays import (
    Source,
    array_source,
    check_elements_apart,
    describe,
    is_array,
    numpy_view_of_cpu_tensor,
    parse_device,
)
from ...errors import (
    CheckpointMismatchError,
    InteropError,
    InvalidTypeError,
    InvalidValueError,
    SharedTensorsError,
    TransferError,
    UnsupportedDtypeError,
    path_error,
)
from ...pipeline.hostcopy import CopyIn
from ...pipeline.plan import Plan, split_bytes
from ...pipeline.progress import Progress
from ...pipeline.request import TransferRequest
from ...pipeline.start import empty_device, start
from .._format import FileReader, FileWriter, Runs, file_identity, move
from ..destination import Destination
from ._header import Entry, Header, code_of, layout, open_regular

__all__ = [
    "Overall",
    "Reader",
    "check_backend",
    "check_name",
    "checked_metadata",
    "described",
    "fill",
    "framework_and_place",
    "nbytes_of_source",
    "refuse_shared",
    "shared_groups",
    "write_file",
]

_FRAMEWORKS = {"pt": "pt", "torch": "pt", "pytorch": "pt", "np": "np", "numpy": "np"}
_FRAMEWORKS |= {"cupy": "cupy", "cp": "cupy"}


def check_name(name: Any, func: str, what: str) -> None:
    """A tensor name or metadata key: a str the header's UTF-8 can hold."""
    if not isinstance(name, str):
        raise InvalidTypeError(f"{func} expected {what}s of type str (got {name!r})")
    try:
        name.encode()
    except UnicodeEncodeError:
        raise InvalidValueError(
            f"{func} expected {what}s that UTF-8 can encode (got {name!r}, with a lone surrogate)"
        ) from None
    if what == "tensor name" and name == "__metadata__":
        raise InvalidValueError(f"{func}: '__metadata__' is the header's, not a tensor name")


def described(tensors: Any, func: str) -> list[tuple[str, Source, str]]:
    """``(name, source, format dtype)`` of each tensor to save; refusals name the tensor."""
    if not isinstance(tensors, Mapping):
        raise InvalidTypeError(
            f"{func} expected a dict of names to tensors (got {describe(tensors)})"
        )
    found = []
    for name, x in tensors.items():
        check_name(name, func, "tensor name")
        if not is_array(x):
            raise InvalidTypeError(
                f"{func} expected tensor {name!r} to be a tensor or an array (got {describe(x)})"
            )
        try:
            src = array_source(x, func)
            found.append((name, src, code_of(src.dtype, name, func)))
        except (InvalidTypeError, InvalidValueError, UnsupportedDtypeError) as exc:
            if repr(name) in str(exc):
                raise
            raise type(exc)(f"{exc} (tensor {name!r})") from exc
    return found


def checked_metadata(metadata: Any, func: str) -> dict[str, str] | None:
    """``metadata`` as a new dict of str to str (None stays None), or the error."""
    if metadata is None:
        return None
    if not isinstance(metadata, Mapping):
        raise InvalidTypeError(
            f"{func} expected metadata to be a dict of str (got {describe(metadata)})"
        )
    for key, value in metadata.items():
        check_name(key, func, "metadata key")
        if not isinstance(value, str):
            raise InvalidTypeError(
                f"{func} expected metadata values of type str (got {value!r} for {key!r}); "
                "the format's metadata is text: convert with str() or json.dumps()"
            )
        check_name(value, func, "metadata value")
    return dict(metadata)


def _extent(x: Any) -> tuple[tuple[str, int], int, int] | None:
    """``(memory, first byte, end)`` of ``x``'s elements; None where it has none
    or is an array interop cannot place (a registered device's)."""
    if isinstance(x, np.ndarray):
        return (("cpu", 0), *np.lib.array_utils.byte_bounds(x)) if x.size else None
    if _backends.is_torch_tensor(x):
        where = ("cpu", 0) if x.device.type == "cpu" else (x.device.type, x.device.index or 0)
        ptr, size, steps = x.data_ptr(), x.element_size(), x.stride()
    elif _backends.is_cupy_array(x):
        where, ptr, size = ("cuda", int(x.device.id)), int(x.data.ptr), x.itemsize
        steps = tuple(s // size for s in x.strides)
    else:
        return None
    if not math.prod(x.shape):
        return None
    spans = [s * (n - 1) * size for s, n in zip(steps, x.shape, strict=True)]
    return where, ptr + sum(s for s in spans if s < 0), ptr + sum(s for s in spans if s > 0) + size


def shared_groups(named: list[tuple[str, Any]]) -> list[list[str]]:
    """The names of arrays whose memory overlaps, in groups of two or more."""
    spans = sorted((e, name) for name, x in named if (e := _extent(x)) is not None)
    groups: list[list[str]] = []
    end, where = 0, None
    for (place, lo, hi), name in spans:
        if place == where and lo < end:
            groups[-1].append(name)
        else:
            groups.append([name])
        where, end = place, max(hi, end) if place == where else hi
    return [sorted(g) for g in groups if len(g) > 1]


def refuse_shared(items: list[tuple[str, Source, str]], func: str) -> None:
    """Raise :class:`SharedTensorsError` naming the tensors to save that share memory."""
    groups = shared_groups([(name, src.obj) for name, src, _ in items])
    if groups:
        raise SharedTensorsError(
            f"{func} expected tensors that do not share memory (got {groups}, each group one "
            "memory: tied weights would be written twice and load as separate tensors); save a "
            "module with interop.safetensors.save_model, which keeps one name of each group as "
            "safetensors does, or save clones"
        )


class Overall:
    """One progress (a tqdm bar or a callback) over several tensors' transfers, for
    a ``with`` block: the callback's error comes out of it as itself, with the
    note of the bytes done in all (not the one its transfer adds)."""

    def __init__(self, progress: Any, total: int, func: str) -> None:
        self.progress = Progress(progress, total, func) if progress else None
        self.notes: list[str] = []

    def __enter__(self) -> Overall:
        return self

    def __exit__(self, kind: Any, exc: BaseException | None, tb: Any) -> None:
        if self.progress is not None:
            self.progress.close()
            if exc is not None and exc is self.progress.raised:
                exc.__notes__ = self.notes  # type: ignore[attr-defined]

    def add(self, n: int) -> None:
        """Count ``n`` more bytes done (its callback's error remembered with its note)."""
        if self.progress is not None and n:
            try:
                self.progress.add(n)
            except BaseException as exc:
                self.notes = list(getattr(exc, "__notes__", []))
                raise

    def part(self) -> Any:
        """A transfer's ``progress`` callback, counting into the whole."""
        if self.progress is None:
            return False
        seen = 0

        def add(done: int, total: int) -> None:
            nonlocal seen
            self.add(done - seen)
            seen = done

        return add


def nbytes_of_source(src: Source) -> int:
    return math.prod(src.shape) * src.dtype.itemsize


def _as_bytes(src: Source, dtype: np.dtype) -> np.ndarray | None:
    """A host array's memory as the file's bytes, zero-copy, where it holds them
    (C order, little-endian, no lazy conjugate/negative bit); else None."""
    obj = src.obj
    if src.on_device:
        return None
    if _backends.is_torch_tensor(obj):
        if obj.is_conj() or obj.is_neg():
            return None
        obj = numpy_view_of_cpu_tensor(obj)
    if not obj.flags.c_contiguous or obj.dtype != dtype:
        return None
    return obj.reshape(-1).view(np.uint8)


def _pwritev_all(fd: int, views: list[memoryview], offset: int) -> None:
    """Write ``views`` back to back at ``offset``, in as few calls as the system takes."""
    while views:
        n = os.pwritev(fd, views[:1024], offset)  # IOV_MAX
        offset += n
        while views and n >= len(views[0]):
            n -= len(views.pop(0))
        if n:
            views[0] = views[0][n:]


class _HostBytes:
    """A host stage writing host arrays' bytes as they are (``parts``: file
    offset, bytes), as one stretch: each piece's bytes of one run of the file
    gathered into one positioned write; a failed write added to ``failed``."""

    def __init__(self, fd: int, parts: list[tuple[int, np.ndarray]], failed: list[OSError]):
        self.fd, self.parts, self.failed = fd, [p for p in parts if p[1].nbytes], failed
        self.starts = list(itertools.accumulate((p.nbytes for _, p in self.parts), initial=0))

    def pieces(self, plan: Plan, i: int, threads: int) -> list[tuple[int, int]]:
        return split_bytes(plan.sizes[i], threads)

    def run(self, plan: Plan, i: int, piece: tuple[int, int], buf: np.ndarray | None) -> None:
        lo, hi = plan.starts[i] + piece[0], plan.starts[i] + piece[1]
        k = bisect.bisect_right(self.starts, lo) - 1
        runs: list[tuple[int, list[memoryview]]] = []  # (file offset, buffers)
        while lo < hi:
            offset, data = self.parts[k]
            a, b = lo - self.starts[k], min(hi, self.starts[k + 1]) - self.starts[k]
            if runs and runs[-1][0] + sum(len(v) for v in runs[-1][1]) == offset + a:
                runs[-1][1].append(data[a:b].data)
            else:
                runs.append((offset + a, [data[a:b].data]))
            lo, k = self.starts[k] + b, k + 1
        try:
            for offset, views in runs:
                _pwritev_all(self.fd, views, offset)
        except OSError as exc:
            self.failed.append(exc)
            raise


def _write_tensor(
    fd: int, entry: Entry, src: Source, dest: Destination, progress: Any, failed: list[OSError]
) -> None:
    """Write ``src`` at its entry's place: device data through the ring, host
    data chunk by chunk, converted (a FIFO's or device's: in order)."""
    runs = None if dest.streaming else Runs(np.array([entry.start], np.int64), entry.nbytes)
    writer = FileWriter(fd, runs, repr(str(dest.path)), src.obj, dtype=entry.dtype)
    writer.failed = failed  # one list for every tensor: a failed write is told from the rest
    order = f"the bytes of tensor {entry.name!r}"
    threads = 1 if dest.streaming else 0
    move(src, writer, dest.func, order, progress=progress, threads=threads)


def _left(dest: Destination) -> str:
    """What a failed save left at its destination, for a message."""
    shown = repr(str(dest.path))
    if dest.streaming:
        return f"{shown} is written into in place: what was written before the error stays"
    if os.path.lexists(dest.target):
        return f"the destination is untouched: {shown} still holds the file it held before"
    return f"the destination is untouched: no file was left under {shown}"


def _restated(dest: Destination, exc: BaseException, failed: list[OSError], func: str) -> Any:
    """The error a failed save raises instead of ``exc`` (None: ``exc`` itself)."""
    cause = exc.__cause__ if isinstance(exc, TransferError) else exc
    wrote = cause is exc or any(cause is e for e in failed)
    if isinstance(cause, OSError) and not isinstance(cause, InteropError) and wrote:
        message = f"{func} could not write {str(dest.path)!r}: {cause.strerror or cause}"
        return path_error(cause.errno, f"{message}; {_left(dest)}", str(dest.path))
    if isinstance(exc, TransferError):
        what = "was cancelled" if cause is None else f"failed ({type(cause).__name__}: {cause})"
        return TransferError(f"{func} {what}; {_left(dest)}", nbytes=exc.nbytes)
    return None


def write_file(
    dest: Destination,
    items: list[tuple[str, Source, str]],
    metadata: dict[str, str] | None,
    overall: Overall,
    func: str,
    *,
    commit: bool = True,
) -> None:
    """Write the file of ``items`` to ``dest``: committed at the end, or (``commit``
    False) left as its temporary for the caller to commit or discard."""
    header, entries = layout([(name, code, src.shape) for name, src, code in items], metadata)
    sources = {name: src for name, src, _ in items}
    failed: list[OSError] = []
    try:
        with dest.open() if commit else open(dest.create(), "wb") as f:
            f.write(header)
            f.flush()
            fd, rest = f.fileno(), entries
            if not dest.streaming:  # sized first, as the package does
                os.ftruncate(fd, len(header) + sum(e.nbytes for e in entries))
                # the host tensors that hold the file's bytes: written from their memory at once
                plain = {e.name: _as_bytes(sources[e.name], e.dtype) for e in entries}
                parts = [(e.start, b) for e in entries if (b := plain[e.name]) is not None]
                if parts:
                    stage = _HostBytes(fd, parts, failed)
                    order = "the bytes of the host tensors, in file order"
                    shape = (sum(b.nbytes for _, b in parts),)
                    request = TransferRequest(
                        func, "h2h", None, stage, shape=shape, progress=overall.part(),
                        order=order, inline=True,
                    )  # fmt: skip
                    start(request).result()
                rest = [e for e in entries if plain[e.name] is None]
            for entry in rest:
                _write_tensor(fd, entry, sources[entry.name], dest, overall.part(), failed)
    except BaseException as exc:
        if not commit:
            dest.discard()
        new = _restated(dest, exc, failed, func)
        if new is None:
            raise
        raise new from (exc.__cause__ if isinstance(exc, TransferError) else exc)


def framework_and_place(
    framework: Any, device: Any, func: str
) -> tuple[str, tuple[str, int | None]]:
    """``framework`` ("pt", "np" or "cupy") and ``device`` as a place; the
    library and, for a GPU, the device checked usable."""
    name = _FRAMEWORKS.get(framework) if isinstance(framework, str) else None
    if name is None:
        raise InvalidValueError(
            f"{func} expected framework 'pt' (torch tensors), 'np' (NumPy arrays) or 'cupy' "
            f"(got {framework!r})"
        )
    try:
        place = parse_device(device) or ("cpu", None)
    except (TypeError, ValueError) as exc:
        raise type(exc)(
            f"{func} expected device 'cpu', 'cuda', 'cuda:N', an int or a torch.device (got "
            f"{device!r})"
        ) from None
    if (name, place[0]) in (("np", "cuda"), ("cupy", "cpu")):
        where = (
            "in host memory: pass device='cpu'" if name == "np" else "on a GPU: pass device='cuda'"
        )
        raise InvalidValueError(
            f"{func} expected framework={framework!r} with a device it holds (got device="
            f"{device!r}); its arrays live {where}, or framework='pt'"
        )
    if place[0] == "cuda":
        (_backends.require_torch_cuda if name == "pt" else _backends.require_cupy_device)()
    elif name == "pt":
        _backends.torch()
    return name, place


def check_backend(backend: Any, func: str) -> bool:
    """``backend``: None or "mmap" (map the file), "pread" (read it into new memory)."""
    if backend not in (None, "mmap", "pread"):
        raise InvalidValueError(
            f"{func} expected backend None, 'mmap' or 'pread' (got {backend!r})"
        )
    return backend == "pread"


def _open_same(header: Header, func: str) -> int:
    """The file of ``header``, unless it was replaced or changed since it was read."""
    fd, st, path = open_regular(header.path, func)
    if file_identity(st) != header.identity:
        os.close(fd)
        raise InvalidValueError(
            f"{func} expected {str(path)!r} to be the file whose header it read (got one "
            "replaced or changed since); call it again once the file is written"
        )
    return fd


def _torch_view(a: np.ndarray) -> Any:
    """A CPU tensor sharing ``a``'s memory (bfloat16 and float8 through their bits)."""
    th = _backends.torch()
    ml = dtypes.ml_view_of_numpy(a.dtype)
    return th.from_numpy(a) if ml is None else th.from_numpy(a.view(ml[1])).view(ml[0])


class Reader:
    """The tensors of one checked file, as ``framework`` arrays at ``place``."""

    def __init__(self, header: Header, framework: str, place: Any, pread: bool, func: str) -> None:
        self.header, self.framework, self.place, self.pread = header, framework, place, pread
        self.func = func
        self._map: mmap.mmap | None = None

    def mapped(self, entry: Entry) -> np.ndarray:
        """The tensor in a copy-on-write map of the file (its pages read when touched)."""
        count = math.prod(entry.shape)
        if not count:
            return np.empty(entry.shape, entry.dtype)
        if self._map is None:
            fd = _open_same(self.header, self.func)
            try:
                prot = mmap.PROT_READ | mmap.PROT_WRITE
                self._map = mmap.mmap(fd, self.header.identity[2], mmap.MAP_PRIVATE, prot)
            finally:
                os.close(fd)
        a = np.frombuffer(self._map, entry.dtype, count, entry.start).reshape(entry.shape)
        return a if entry.start % entry.dtype.itemsize == 0 else a.copy()  # aligned for torch

    def close(self) -> None:
        """Let go of the map (the tensors made from it keep it alive)."""
        self._map = None

    def wrap(self, host: np.ndarray) -> Any:
        """A host array as the framework's (a CPU tensor for "pt", zero-copy)."""
        return host if self.framework == "np" else _torch_view(host)

    def empty(self, shape: tuple[int, ...], dtype: np.dtype) -> Any:
        """A new device array of the framework's."""
        index = self.place[1]
        if self.framework == "cupy":
            return empty_device(shape, dtype.newbyteorder("="), index, self.func)
        th = _backends.torch()
        device = th.device("cuda") if index is None else th.device("cuda", index)
        return th.empty(shape, dtype=dtypes.torch_dtype_of_numpy(dtype), device=device)

    def read(self, entries: list[tuple[Entry, Any]], overall: Overall) -> None:
        """Fill each target (host: a NumPy array) from its entry's bytes."""
        fd = _open_same(self.header, self.func)
        try:
            for entry, target in entries:
                runs = Runs(np.array([entry.start], np.int64), entry.nbytes)
                host = target if isinstance(target, np.ndarray) else None
                reader = FileReader(fd, runs, repr(str(self.header.path)), host, dtype=entry.dtype)
                order = f"the bytes of tensor {entry.name!r}"
                dst = array_source(target, self.func)
                move(dst, reader, self.func, order, progress=overall.part())
        finally:
            os.close(fd)

    def tensors(self, names: list[str], overall: Overall) -> dict[str, Any]:
        """The tensors ``names``: mapped, or read into new host or device memory."""
        entries = [self.header.entries[name] for name in names]
        if self.place[0] == "cpu" and not self.pread:
            out = {}
            for entry in entries:
                out[entry.name] = self.wrap(self.mapped(entry))
                overall.add(entry.nbytes)
            return out
        if self.place[0] == "cpu":
            targets = [np.empty(e.shape, e.dtype) for e in entries]
        else:
            targets = [self.empty(e.shape, e.dtype) for e in entries]
        self.read(list(zip(entries, targets, strict=True)), overall)
        wrapped = targets if self.place[0] == "cuda" else [self.wrap(t) for t in targets]
        return {e.name: t for e, t in zip(entries, wrapped, strict=True)}

    def part(self, entry: Entry, index: Any) -> Any:
        """``tensor[index]`` (NumPy basic or advanced indexing), read from the map."""
        host = np.array(self.mapped(entry)[index])
        if self.place[0] == "cpu":
            return self.wrap(host)
        target = self.empty(host.shape, host.dtype)
        feed = CopyIn(host, host.dtype)
        device = array_source(target, self.func)
        start(TransferRequest(self.func, "h2d", target, feed, device=device, inline=True)).result()
        return target


def _target(x: Any, entry: Entry, func: str) -> tuple[Any, str | None]:
    """What ``move`` fills for tensor ``x`` (a host one as NumPy), or why it cannot."""
    name = entry.name
    if not is_array(x) or isinstance(x, np.generic):
        raise InvalidTypeError(
            f"{func} expected tensor {name!r} to be a tensor or an array it can fill in place "
            f"(got {describe(x)})"
        )
    if _backends.is_torch_tensor(x):
        if x.is_conj() or x.is_neg():
            return x, "has the conjugate or negative bit set: resolve it first"
        x = x.detach()  # the same memory: filled as load_state_dict fills, outside autograd
    src = array_source(x, func)
    if src.shape != entry.shape or src.dtype != entry.dtype:
        have = (
            f"shape {src.shape} {src.dtype}{' (big-endian)' if src.dtype.byteorder == '>' else ''}"
        )
        return x, f"is {have}, the file's {entry.shape} {entry.dtype}"
    if not src.on_device:
        x = src.obj if isinstance(src.obj, np.ndarray) else numpy_view_of_cpu_tensor(src.obj)
        if not x.flags.writeable:
            return x, "is read-only"
    check_elements_apart(x, func, f" for tensor {name!r}")
    return x, None


def fill(
    headers: list[Header], targets: Mapping[str, Any], strict: bool, progress: Any, func: str
) -> tuple[list[str], list[str]]:
    """Fill ``targets`` from the files: every name, shape and dtype checked first."""
    if not isinstance(targets, Mapping):
        raise InvalidTypeError(
            f"{func} expected a dict of names to tensors (got {describe(targets)})"
        )
    found = {name: (h, e) for h in headers for name, e in h.entries.items()}
    for name in targets:
        check_name(name, func, "tensor name")
    groups = shared_groups([(name, x) for name, x in targets.items() if name in found])
    if groups:
        raise SharedTensorsError(
            f"{func} expected the tensors it fills not to share memory (got {groups}, each "
            "group one memory, each name in the file); pass one name of each group"
        )
    tied = {n: g for g in shared_groups(list(targets.items())) for n in g}
    missing = [
        n for n in targets if n not in found and not any(m in found for m in tied.get(n, ()))
    ]
    unexpected = [n for n in found if n not in targets]
    if strict and (missing or unexpected):
        raise CheckpointMismatchError(
            f"{func} expected the file to hold exactly the tensors to fill (got missing "
            f"{missing}, unexpected {unexpected}); pass strict=False to fill what it holds"
        )
    work: dict[Path, list[tuple[Entry, Any]]] = {}
    wrong = []
    for name, (header, entry) in found.items():
        if name in targets:
            target, why = _target(targets[name], entry, func)
            wrong += [f"{name!r} {why}"] if why else []
            work.setdefault(header.path, []).append((entry, target))
    if wrong:
        raise CheckpointMismatchError(
            f"{func} expected tensors it can fill with the file's values, nothing was "
            f"written (got {len(wrong)} that it cannot: {'; '.join(wrong[:8])})"
        )
    total = sum(e.nbytes for pairs in work.values() for e, _ in pairs)
    with Overall(progress, total, func) as overall:
        for header in headers:
            if header.path in work:
                Reader(header, "np", ("cpu", None), True, func).read(work[header.path], overall)
    return missing, unexpected
