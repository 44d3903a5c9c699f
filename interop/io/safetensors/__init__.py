"""Checkpoints in the safetensors format, streamed: ``interop.safetensors``.

The names and signatures of ``safetensors.torch`` 0.8 (``save_file``,
``load_file``, ``save_model``, ``load_model``, ``safe_open``), plus interop's
own keyword-only ``progress=``, ``framework=``, :func:`load_into` and
:func:`save_sharded`. The format is :mod:`interop.io.safetensors._header`'s,
the moving of bytes :mod:`interop.io.safetensors._checkpoint`'s.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ...errors import (
    CheckpointMismatchError,
    InvalidValueError,
    SharedTensorsError,
    path_error,
)
from ...pipeline.request import check_options
from ..destination import Destination, checked_path, prepare_destination
from ._checkpoint import (
    Overall,
    Reader,
    check_backend,
    checked_metadata,
    described,
    fill,
    framework_and_place,
    nbytes_of_source,
    refuse_shared,
    shared_groups,
    write_file,
)
from ._header import INDEX, Entry, read_checkpoint, read_header

__all__ = [
    "load_file",
    "load_into",
    "load_model",
    "safe_open",
    "save_file",
    "save_model",
    "save_sharded",
]

_SHARD = re.compile(r"model(-\d{5}-of-\d{5})?\.safetensors(\.index\.json)?")
_UNITS = {"": 1, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}


def save_file(
    tensors: Mapping[str, Any],
    filename: str | os.PathLike[str],
    metadata: Mapping[str, str] | None = None,
    *,
    progress: Any = False,
) -> Path:
    """Save tensors to a safetensors file, streaming each from its memory.

    Parameters
    ----------
    tensors : dict of str to array
        CPU or CUDA tensors, CuPy or NumPy arrays (``ml_dtypes`` bfloat16 and
        float8 too), any mix, any strides, big-endian NumPy too: written in C
        order, little-endian, without a full-size temporary.
    filename : str or os.PathLike
        Written as given (no suffix added), with :func:`interop.save_npy`'s
        rules: a new or regular file is replaced atomically when complete (a
        failed save leaves the old file as it was and no temporary), a symlink
        is followed, a FIFO or character device is written into in order; a
        directory or a file this process may not write is refused first.
    metadata : dict of str to str, optional
        The header's ``__metadata__``.
    progress : bool or callable
        Interop's: ``True`` shows a tqdm bar in bytes; a callable is called as
        ``progress(bytes_done, bytes_total)`` over the whole file.

    Returns
    -------
    pathlib.Path
        ``filename``.

    Notes
    -----
    The file is the safetensors package's, byte for byte without metadata
    (tensors laid out by dtype alignment, then by name). Host tensors are
    written from their own memory (a converted chunk at a time where they are
    strided, big-endian, or carry PyTorch's conjugate/negative bit); device
    tensors go through the staging ring of :func:`interop.copy_to_host`, each
    ordered after the work queued on its library's current stream, the DMA of
    one chunk overlapping the write of the one before. Extra host memory: the
    ring (or one chunk buffer), whatever the checkpoint's size.

    Raises
    ------
    SharedTensorsError
        Tensors that share memory (tied weights), named; a ``RuntimeError``,
        as safetensors raises. :func:`save_model` keeps one of each group.
    InvalidTypeError
        ``tensors`` not a dict, a name that is not a str, a value that is not
        an array, a metadata value that is not a str, a bad ``progress``.
    InvalidValueError
        A name with a lone surrogate or named ``__metadata__``, a meta tensor.
    UnsupportedDtypeError
        A dtype the format has no code for (complex128, complex32, float4, ...).
    PathError
        The destination refused (as :func:`interop.save_npy`), or a write that
        failed (``errno.ENOSPC``, ...): the old file intact, no temporary left.
    TransferError
        A device chunk failed otherwise; nothing is left under ``filename``.
    """
    check_options(None, progress)
    items = described(tensors, "save_file")
    metadata = checked_metadata(metadata, "save_file")
    refuse_shared(items, "save_file")
    dest = prepare_destination(filename, "save_file", suffix=None)
    total = sum(nbytes_of_source(src) for _, src, _ in items)
    with Overall(progress, total, "save_file") as overall:
        write_file(dest, items, metadata, overall, "save_file")
    return dest.path


def _covers_storage(t: Any) -> bool:
    """True for a tensor that is the whole of its storage (safetensors' "complete")."""
    storage = t.untyped_storage()
    return t.data_ptr() == storage.data_ptr() and t.numel() * t.element_size() == storage.nbytes()


def _tied(
    state: dict[str, Any], func: str, preferred: frozenset[str] = frozenset()
) -> dict[str, str]:
    """Each tied name of a state dict but the one kept, to the kept one (the
    first whole-storage name, sorted, in ``preferred`` where one is)."""
    dropped: dict[str, str] = {}
    for group in shared_groups(list(state.items())):
        whole = [name for name in group if _covers_storage(state[name])]
        if not whole:
            raise SharedTensorsError(
                f"{func} expected one of the tensors sharing memory {group} to cover all of it "
                "(got none: each is a part); clone the parts you mean to keep"
            )
        keep = (sorted(set(whole) & preferred) or whole)[0]
        dropped |= {name: keep for name in group if name != keep}
    return dropped


def save_model(
    model: Any,
    filename: str | os.PathLike[str],
    metadata: Mapping[str, str] | None = None,
    force_contiguous: bool = True,
) -> Path:
    """Save a module's ``state_dict()``, tied weights once, as safetensors does.

    Of each group of tensors that share memory, the first name (sorted) that
    covers all of it is kept and the others are dropped, each recorded in the
    metadata as ``{dropped: kept}`` (a key the caller set is kept).
    ``force_contiguous`` is accepted for compatibility: every tensor is
    written in C order anyway, without a copy. Otherwise as :func:`save_file`;
    raises :class:`SharedTensorsError` where no name of a group covers it.
    """
    state = model.state_dict()
    meta = None if metadata is None else dict(metadata)
    for name, keep in _tied(state, "save_model").items():
        meta = {} if meta is None else meta
        meta.setdefault(name, keep)
        del state[name]
    return save_file(state, filename, meta)


def _shard_bytes(size: Any) -> int:
    """``max_shard_size`` in bytes: an int, or "5GB" (10**9) / "5GiB" (2**30)."""
    if isinstance(size, int) and not isinstance(size, bool) and size > 0:
        return size
    found = re.fullmatch(r"\s*(\d+(?:\.\d*)?)\s*([KMGT]?)(i?)B\s*", str(size), re.IGNORECASE)
    if not isinstance(size, str) or found is None or float(found[1]) <= 0:
        raise InvalidValueError(
            f"save_sharded expected max_shard_size to be a positive int of bytes or a size "
            f"such as '5GB' (10**9 bytes) or '5GiB' (2**30) (got {size!r})"
        )
    unit = found[2].upper()
    scale = 1024 ** "_KMGT".index(unit) if found[3] and unit else _UNITS[unit]
    return int(float(found[1]) * scale)


def _shards(items: list[Any], limit: int) -> list[list[Any]]:
    """Tensors in shards of at most ``limit`` bytes, in order, as huggingface_hub
    splits them (a larger tensor alone in its own shard)."""
    shards: list[list[Any]] = []
    current: list[Any] = []
    size = 0
    for item in items:
        n = nbytes_of_source(item[1])
        if n > limit:
            shards.append([item])
            continue
        if size + n > limit:
            shards.append(current)
            current, size = [], 0
        current.append(item)
        size += n
    return [*shards, current] if current or not shards else shards


def save_sharded(
    tensors: Mapping[str, Any],
    directory: str | os.PathLike[str],
    *,
    max_shard_size: int | str = "5GB",
    metadata: Mapping[str, str] | None = None,
    progress: Any = False,
) -> Path:
    """Save tensors as a Hugging Face checkpoint in ``directory`` (interop's own).

    The tensors go, in order, into shards of at most ``max_shard_size`` (an
    int of bytes, or "5GB" = 5 * 10**9, "500MiB" = 500 * 2**20); a larger
    tensor alone in its own. Several shards are ``model-00001-of-0000N.safetensors``
    ... and ``model.safetensors.index.json`` (``{"metadata": {"total_size": ...,
    **metadata}, "weight_map": {name: file}}``, each shard's metadata
    ``{"format": "pt"}``); one shard is ``model.safetensors`` with
    ``{"format": "pt", **metadata}``, as ``huggingface_hub`` writes them.
    ``directory`` is created if missing.

    Every file is written to a temporary beside it first; the shards replace
    the old ones once all are complete, then the index, then files of an
    older checkpoint of this layout in ``directory`` are removed. A failure
    leaves the old checkpoint as it was. Otherwise as :func:`save_file`
    (tensors sharing memory anywhere among them are refused).

    Returns
    -------
    pathlib.Path
        What to load from: the index, or ``model.safetensors``.
    """
    func = "save_sharded"
    check_options(None, progress)
    limit = _shard_bytes(max_shard_size)
    items = described(tensors, func)
    meta = checked_metadata(metadata, func) or {}
    refuse_shared(items, func)
    directory = Path(checked_path(directory, func))
    shards = _shards(items, limit)
    n = len(shards)
    names = [f"model-{i:05d}-of-{n:05d}.safetensors" for i in range(1, n + 1)]
    names = names if n > 1 else ["model.safetensors"]
    made = not directory.exists()
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        why = f"{func} cannot make the directory {str(directory)!r}: {exc.strerror}"
        raise path_error(exc.errno, why, str(directory)) from exc
    dests: list[Destination] = []
    total = sum(nbytes_of_source(src) for _, src, _ in items)
    try:
        with Overall(progress, total, func) as overall:
            dests = [prepare_destination(directory / name, func, suffix=None) for name in names]
            shard_meta = {"format": "pt"} | (meta if n == 1 else {})
            for dest, shard in zip(dests, shards, strict=True):
                write_file(dest, shard, shard_meta, overall, func, commit=False)
        for dest in dests:  # the old checkpoint replaced once every shard is complete
            dest.commit()
        if n > 1:
            weights = {i[0]: name for name, shard in zip(names, shards, strict=True) for i in shard}
            index = {"metadata": {"total_size": total, **meta}, "weight_map": weights}
            with prepare_destination(directory / INDEX, func, suffix=None).open() as f:
                f.write(json.dumps(index, indent=2).encode())
    except BaseException:
        for dest in dests:
            dest.discard()
        if made:
            with contextlib.suppress(OSError):
                directory.rmdir()
        raise
    kept = {*names, INDEX} if n > 1 else set(names)
    for old in os.listdir(directory):
        if _SHARD.fullmatch(old) and old not in kept:
            with contextlib.suppress(OSError):
                os.unlink(directory / old)
    return directory / (INDEX if n > 1 else names[0])


class _Slice:
    """One tensor of a :class:`safe_open` file, read in part by indexing it."""

    def __init__(self, reader: Reader, entry: Entry) -> None:
        self._reader, self._entry = reader, entry

    def get_shape(self) -> list[int]:
        return list(self._entry.shape)

    def get_dtype(self) -> str:
        """The format's dtype ("F32", "BF16", ...)."""
        return self._entry.code

    def __getitem__(self, index: Any) -> Any:
        return self._reader.part(self._entry, index)


class safe_open:  # the safetensors package's name
    """Open a safetensors file to read some of its tensors, or parts of them.

    As ``safetensors.safe_open``: a context manager with ``keys()`` (sorted),
    ``offset_keys()`` (in file order), ``metadata()`` (a dict, or None),
    ``get_tensor(name)``, ``get_tensors()`` and ``get_slice(name)``, whose
    ``get_shape()``, ``get_dtype()`` and ``[index]`` read only the part asked
    for. ``framework``: "pt" (torch tensors), "np" (NumPy arrays, host only)
    or "cupy" (device only); ``device``: "cpu", "cuda", "cuda:N" or an int.
    ``backend``: None or "mmap" maps the file copy-on-write for host tensors
    (as the package does: pages are read when first touched, writes stay
    private; a file later changed *in place* changes or invalidates them, a
    file replaced by a save does not); "pread" reads into new memory. Device
    tensors stream from the file through the staging ring (a slice: through
    the ring from its host copy). The header is checked when the file is
    opened; errors as :func:`load_file`.
    """

    def __init__(
        self,
        filename: str | os.PathLike[str],
        framework: str = "pt",
        device: Any = "cpu",
        *,
        backend: str | None = None,
    ) -> None:
        framework, place = framework_and_place(framework, device, "safe_open")
        pread = check_backend(backend, "safe_open")
        self._reader = Reader(
            read_header(filename, "safe_open"), framework, place, pread, "safe_open"
        )

    def __enter__(self) -> safe_open:
        return self

    def __exit__(self, *exc: object) -> None:
        self._reader.close()

    def keys(self) -> list[str]:
        return sorted(self._reader.header.entries)

    def offset_keys(self) -> list[str]:
        return list(self._reader.header.entries)

    def metadata(self) -> dict[str, str] | None:
        meta = self._reader.header.metadata
        return None if meta is None else dict(meta)

    def _entry(self, name: str) -> Entry:
        entry = self._reader.header.entries.get(name)
        if entry is None:
            raise KeyError(f"safe_open: no tensor {name!r} in {str(self._reader.header.path)!r}")
        return entry

    def get_tensor(self, name: str) -> Any:
        return self._reader.tensors([self._entry(name).name], Overall(False, 0, ""))[name]

    def get_tensors(self) -> dict[str, Any]:
        return self._reader.tensors(self.offset_keys(), Overall(False, 0, ""))

    def get_slice(self, name: str) -> _Slice:
        return _Slice(self._reader, self._entry(name))


def load_file(
    filename: str | os.PathLike[str],
    device: Any = "cpu",
    *,
    backend: str | None = None,
    framework: str = "pt",
    progress: Any = False,
) -> dict[str, Any]:
    """Load every tensor of a safetensors file, or of a sharded checkpoint.

    Parameters
    ----------
    filename : str or os.PathLike
        A safetensors file, or a ``model.safetensors.index.json`` (its shards
        are read beside it; see :func:`save_sharded`).
    device : str or int
        "cpu" (default), "cuda", "cuda:N", an int or a ``torch.device``.
    backend : None, "mmap" or "pread"
        For host tensors, as in :class:`safe_open`: mapped (default) or read.
    framework : "pt", "np" or "cupy"
        Interop's: torch tensors (default), NumPy arrays (host only) or CuPy
        arrays (device only).
    progress : bool or callable
        As for :func:`save_file`, over every tensor.

    Returns
    -------
    dict of str to array

    Notes
    -----
    Every header is checked against its file before anything is allocated.
    To a GPU, each tensor is allocated on the device and filled from the
    file through the staging ring of :func:`interop.copy_to_device` (host
    threads read chunks into pinned slots while earlier ones are copied),
    never through a full host copy, ordered after the library's current
    stream; the call returns when the data is there.

    Raises
    ------
    CheckpointFormatError
        A file (or index) the format does not allow: a header length past the
        end or over 100 MB, a header not UTF-8 or not JSON, offsets that
        overlap, leave holes, are negative or disagree with shape and dtype,
        an unknown dtype, a truncated data section; an index naming files
        outside its directory or disagreeing with its shards. A ``ValueError``.
    PathError
        No such file (an index's shard included), a directory, a FIFO.
    NoDeviceError, BackendUnavailableError
        A GPU ``device`` without one; ``framework`` without its library.
    InvalidValueError
        A bad ``framework``, ``device`` or ``backend``; a file changed while read.
    TransferError
        A read or copy failed part-way.
    """
    framework, place = framework_and_place(framework, device, "load_file")
    pread = check_backend(backend, "load_file")
    check_options(None, progress)
    headers = read_checkpoint(filename, "load_file")
    total = sum(e.nbytes for h in headers for e in h.entries.values())
    out: dict[str, Any] = {}
    with Overall(progress, total, "load_file") as overall:
        for header in headers:
            reader = Reader(header, framework, place, pread, "load_file")
            out |= reader.tensors(list(header.entries), overall)
    return out


def load_into(
    filename: str | os.PathLike[str],
    tensors: Mapping[str, Any],
    *,
    strict: bool = True,
    progress: Any = False,
) -> tuple[list[str], list[str]]:
    """Fill existing tensors in place from a safetensors file (interop's own).

    Parameters
    ----------
    filename : str or os.PathLike
        A safetensors file or a checkpoint index, as for :func:`load_file`.
    tensors : dict of str to array
        What to fill, e.g. ``model.state_dict()`` on the GPU: CPU or CUDA
        tensors, NumPy or CuPy arrays, any strides, each with the file's shape
        and dtype. A model is never held twice: no new tensor is made.
    strict : bool
        True (default): the file must hold exactly these names. False: fill
        those it holds, leave the rest. A name the file lacks whose tensor
        shares memory with a filled one (a tied weight) is filled through it.
    progress : bool or callable
        As for :func:`save_file`.

    Returns
    -------
    (missing, unexpected) : (list of str, list of str)
        Names of ``tensors`` the file lacks, names of the file not filled.

    Notes
    -----
    Every name, shape and dtype is checked before a byte is written. Host
    tensors are read into straight from the file (through one chunk buffer
    where strided), device tensors through the staging ring, ordered after
    the library's current stream. Writes bypass autograd, as
    ``load_state_dict`` does.

    Raises
    ------
    CheckpointMismatchError
        Names missing or unexpected (``strict``), a shape or dtype that
        differs, a read-only or conjugate-bit target (all listed); a
        ``ValueError`` and a ``RuntimeError``. Nothing was written.
    SharedTensorsError
        Two names the file holds whose tensors share memory.
    InvalidTypeError, InvalidValueError
        ``tensors`` not a dict of arrays, a target whose elements overlap.
    CheckpointFormatError, PathError, TransferError
        As for :func:`load_file`.
    """
    check_options(None, progress)
    return fill(read_checkpoint(filename, "load_into"), tensors, strict, progress, "load_into")


def load_model(
    model: Any,
    filename: str | os.PathLike[str],
    strict: bool = True,
    device: Any = "cpu",
    *,
    backend: str | None = None,
) -> tuple[set[str], list[str]]:
    """Fill a module's tensors in place from a safetensors file (or index).

    As ``safetensors.torch.load_model``, but in place (:func:`load_into`):
    the module's tensors are filled where they are (``device`` and
    ``backend`` are accepted for compatibility and not used), with the
    file's dtype (no conversion). Tied weights saved once by
    :func:`save_model` fill every name of their group.

    Returns
    -------
    (missing, unexpected) : (set of str, list of str)
        As safetensors returns them.

    Raises
    ------
    CheckpointMismatchError
        ``strict`` and names missing or unexpected (the message as safetensors
        words it), or a shape or dtype that differs; also a ``RuntimeError``.
        Raised before anything is written (safetensors raises after loading).
    Others as :func:`load_into`.
    """
    check_backend(backend, "load_model")
    headers = read_checkpoint(filename, "load_model")
    in_file = {name for h in headers for name in h.entries}
    state = model.state_dict()
    dropped = _tied(state, "load_model", frozenset(in_file))
    targets = {name: t for name, t in state.items() if name not in dropped}
    missing = {name for name in targets if name not in in_file}
    unexpected = [name for h in headers for name in h.entries if name not in targets]
    unexpected += [name for name in dropped if name in in_file and name not in unexpected]
    if strict and (missing or unexpected):
        error = f"Error(s) in loading state_dict for {model.__class__.__name__}:"
        if missing:
            error += "\n    Missing key(s) in state_dict: " + ", ".join(
                f'"{k}"' for k in sorted(missing)
            )
        if unexpected:
            error += "\n    Unexpected key(s) in state_dict: " + ", ".join(
                f'"{k}"' for k in sorted(unexpected)
            )
        raise CheckpointMismatchError(error)
    fill(headers, {k: v for k, v in targets.items() if k in in_file}, False, False, "load_model")
    return missing, unexpected
