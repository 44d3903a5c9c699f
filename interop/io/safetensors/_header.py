"""The safetensors file, and the Hugging Face index of a sharded checkpoint.

A file is an 8-byte little-endian header length, a JSON header padded with
spaces to a multiple of 8 bytes, then every tensor's bytes (C order,
little-endian), back to back in the order of their ``data_offsets``.
:func:`layout` places tensors as the safetensors package does (by dtype
alignment, largest first, then by name), so that a file written without
metadata is byte for byte the package's. :func:`read_checkpoint` checks a
header against its file (or an index against its shards) before anything is
allocated from it.
"""

from __future__ import annotations

import json
import math
import os
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import ml_dtypes
import numpy as np

from ...errors import CheckpointFormatError, InvalidValueError, UnsupportedDtypeError, path_error
from .. import _format
from .._format import file_identity
from ..destination import checked_path

__all__ = [
    "INDEX",
    "Entry",
    "Header",
    "code_of",
    "layout",
    "open_regular",
    "read_checkpoint",
    "read_header",
]

N_LEN = 8  # bytes of the header length
MAX_HEADER = 100_000_000  # bytes: the safetensors package reads no longer header (nor index)
INDEX = "model.safetensors.index.json"

# The format's dtypes in the package's order of alignment (its Dtype enum,
# without the sub-byte F4 and F6 that no NumPy or PyTorch dtype holds).
_DTYPES = {
    code: np.dtype(dtype).newbyteorder("<")
    for code, dtype in (
        ("BOOL", np.bool_),
        ("U8", np.uint8),
        ("I8", np.int8),
        ("F8_E5M2", ml_dtypes.float8_e5m2),
        ("F8_E4M3", ml_dtypes.float8_e4m3fn),
        ("F8_E8M0", ml_dtypes.float8_e8m0fnu),
        ("F8_E4M3FNUZ", ml_dtypes.float8_e4m3fnuz),
        ("F8_E5M2FNUZ", ml_dtypes.float8_e5m2fnuz),
        ("I16", np.int16),
        ("U16", np.uint16),
        ("F16", np.float16),
        ("BF16", ml_dtypes.bfloat16),
        ("I32", np.int32),
        ("U32", np.uint32),
        ("F32", np.float32),
        ("C64", np.complex64),
        ("F64", np.float64),
        ("I64", np.int64),
        ("U64", np.uint64),
    )
}
_RANK = {code: rank for rank, code in enumerate(_DTYPES)}
_CODES = {dtype: code for code, dtype in _DTYPES.items()}


@dataclass(frozen=True)
class Entry:
    """One tensor of a file: ``nbytes`` at byte ``start`` of the file."""

    name: str
    code: str  # the format's dtype ("F32")
    shape: tuple[int, ...]
    start: int
    nbytes: int

    @property
    def dtype(self) -> np.dtype:
        """The NumPy (or ``ml_dtypes``) dtype, little-endian."""
        return _DTYPES[self.code]


@dataclass(frozen=True)
class Header:
    """A file's header, checked against the file."""

    path: Path
    entries: dict[str, Entry]  # in file order
    metadata: dict[str, str] | None
    identity: tuple[int, int, int, int]  # as file_identity gives it when the header was read


def code_of(dtype: np.dtype, name: str, func: str) -> str:
    """The format's dtype for ``dtype`` (any byte order), or UnsupportedDtypeError."""
    code = _CODES.get(np.dtype(dtype).newbyteorder("<"))
    if code is None:
        raise UnsupportedDtypeError(
            f"{func} expected a dtype the safetensors format holds (got {dtype} for tensor "
            f"{name!r}); it holds {', '.join(_DTYPES)}: convert the tensor first"
        )
    return code


def layout(
    specs: list[tuple[str, str, tuple[int, ...]]], metadata: dict[str, str] | None
) -> tuple[bytes, list[Entry]]:
    """The header (its length included) of a file of ``specs`` (name, code,
    shape), and its entries in file order."""
    placed = sorted(specs, key=lambda s: (-_RANK[s[1]], s[0]))
    header: dict[str, Any] = {} if metadata is None else {"__metadata__": metadata}
    offsets = [0]
    for name, code, shape in placed:
        offsets.append(offsets[-1] + math.prod(shape) * _DTYPES[code].itemsize)
        header[name] = {"dtype": code, "shape": list(shape), "data_offsets": offsets[-2:]}
    # serde_json's compact form, which escapes what json.dumps escapes
    text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode()
    text += b" " * (-len(text) % N_LEN)
    if len(text) > MAX_HEADER:
        raise InvalidValueError(
            f"expected a header of at most {MAX_HEADER} bytes (got {len(text)}: too many "
            "tensors or too much metadata); split the tensors into shards (save_sharded)"
        )
    start = N_LEN + len(text)
    entries = [
        Entry(name, code, tuple(shape), start + lo, hi - lo)
        for (name, code, shape), lo, hi in zip(placed, offsets, offsets[1:], strict=False)
    ]
    return len(text).to_bytes(N_LEN, "little") + text, entries


# ----------------------------------------------------------------------- reading


def open_regular(path: Any, func: str) -> tuple[int, os.stat_result, Path]:
    """:func:`interop.io._format.open_regular` with a checkpoint's fixes."""
    directory = f"pass the {INDEX} or model.safetensors in it"
    return _format.open_regular(path, func, directory, "pass a regular file")


def _read(fd: int, n: int, offset: int) -> bytes:
    parts, got = [], 0
    while got < n:
        part = os.pread(fd, n - got, offset + got)
        if not part:
            break
        parts.append(part)
        got += len(part)
    return b"".join(parts)


def _unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object's members; a name given twice is an error (which would win?)."""
    obj = dict(pairs)
    if len(obj) != len(pairs):
        twice = sorted(k for k, n in Counter(k for k, _ in pairs).items() if n > 1)
        raise ValueError(f"names {twice} given more than once")
    return obj


def _json(raw: bytes, fail: Any) -> dict[str, Any]:
    try:
        obj = json.loads(raw.decode(), object_pairs_hook=_unique)
    except UnicodeDecodeError as exc:
        fail(f"its header is not UTF-8 ({exc})")
    except ValueError as exc:
        fail(f"its header is not JSON ({exc})")
    if not isinstance(obj, dict):
        fail(f"its header is JSON but not an object (got {type(obj).__name__})")
    return obj


def _is_count(v: Any) -> bool:
    return type(v) is int and v >= 0


def _entry(name: str, info: Any, base: int, fail: Any) -> tuple[Entry, int, int]:
    """The entry of tensor ``name`` (data at file byte ``base``) and its data offsets."""
    if not isinstance(info, dict) or not {"dtype", "shape", "data_offsets"} <= info.keys():
        fail(f"tensor {name!r} is {str(info)[:80]!r}, expected dtype, shape and data_offsets")
    code, shape, offsets = info["dtype"], info["shape"], info["data_offsets"]
    if code not in _DTYPES:
        fail(f"tensor {name!r} has dtype {code!r}, expected one of {', '.join(_DTYPES)}")
    if not isinstance(shape, list) or not all(_is_count(n) for n in shape):
        fail(f"tensor {name!r} has shape {shape!r}, expected a list of ints >= 0")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(map(_is_count, offsets))):
        fail(f"tensor {name!r} has data_offsets {offsets!r}, expected two ints >= 0")
    lo, hi = offsets
    need = math.prod(shape) * _DTYPES[code].itemsize
    if hi - lo != need:
        fail(
            f"tensor {name!r} has data_offsets [{lo}, {hi}], {hi - lo} bytes, where its shape "
            f"{shape} of {code} needs {need}"
        )
    return Entry(name, code, tuple(shape), base + lo, need), lo, hi


def read_header(path: Any, func: str) -> Header:
    """Read and check a safetensors file's header (the module's rules); a
    :class:`CheckpointFormatError` names the file and the tensor at fault."""
    fd, st, path = open_regular(path, func)

    def fail(why: str) -> NoReturn:
        raise CheckpointFormatError(
            f"{func} expected a safetensors file (got {str(path)!r}: {why}); nothing was read "
            "into memory from it. Was it truncated or written by something else?"
        )

    try:
        size, head = st.st_size, _read(fd, N_LEN, 0)
        if len(head) < N_LEN:
            fail(f"{size} bytes, shorter than the header length's {N_LEN}")
        n = int.from_bytes(head, "little")
        if n > MAX_HEADER:
            fail(f"a header length of {n} bytes, more than the format's {MAX_HEADER}")
        if N_LEN + n > size:
            fail(f"a header length of {n} bytes, past the end of the file ({size} bytes)")
        raw = _read(fd, n, N_LEN)
    finally:
        os.close(fd)
    obj = _json(raw, fail)
    metadata = obj.pop("__metadata__", None)
    if metadata is not None and not (
        isinstance(metadata, dict) and all(isinstance(v, str) for v in metadata.values())
    ):
        fail(f"__metadata__ is {str(metadata)[:80]!r}, expected an object of strings")
    found = sorted(
        (_entry(name, info, N_LEN + n, fail) for name, info in obj.items()),
        key=lambda e: (e[1], e[2]),
    )
    end = 0
    for entry, lo, hi in found:
        if lo != end:
            where = "overlapping the tensor before it" if lo < end else "leaving a hole"
            fail(f"tensor {entry.name!r} starts at data byte {lo}, {where} (expected {end})")
        end = hi
    if N_LEN + n + end != size:
        state = "truncated" if size < N_LEN + n + end else "longer than its header says"
        fail(f"{state}: {size} bytes where the header gives {N_LEN + n + end}")
    entries = {entry.name: entry for entry, _, _ in found}
    return Header(path, entries, metadata, file_identity(st))


def read_checkpoint(path: Any, func: str) -> list[Header]:
    """The headers of a file, or of every shard of an index (a path ending in
    ``.json``), each shard's names checked against the index's."""
    if not checked_path(path, func).endswith(".json"):
        return [read_header(path, func)]
    fd, st, path = open_regular(path, func)
    shown = repr(str(path))

    def fail(why: str) -> NoReturn:
        raise CheckpointFormatError(f"{func} expected a checkpoint index (got {shown}: {why})")

    try:
        if st.st_size > MAX_HEADER:
            fail(f"{st.st_size} bytes, more than the {MAX_HEADER} an index may have")
        obj = _json(_read(fd, st.st_size, 0), fail)
    finally:
        os.close(fd)
    weights = obj.get("weight_map")
    if not isinstance(weights, dict) or not all(isinstance(f, str) for f in weights.values()):
        fail('no "weight_map" object of tensor names to file names')
    shards: dict[str, set[str]] = {}
    for name, file in weights.items():
        if file in ("", ".", "..") or Path(file).name != file:
            fail(f"tensor {name!r} is mapped to {file!r}, which is not a file beside the index")
        shards.setdefault(file, set()).add(name)
    headers = []
    for file, names in shards.items():
        try:
            header = read_header(path.parent / file, func)
        except OSError as exc:  # a PathError: missing, unreadable
            message = f"the index {shown} names the shard {file!r}: {exc.strerror}"
            raise path_error(exc.errno, message, exc.filename) from exc
        extra, lacking = (
            sorted(header.entries.keys() - names),
            sorted(names - header.entries.keys()),
        )
        if extra or lacking:
            fail(
                f"its shard {file!r} holds {extra} that the index does not map to it and lacks "
                f"{lacking} that it does; save the checkpoint again"
            )
        headers.append(header)
    return headers
