"""Every error interop raises is an ``interop.InteropError`` and the built-in a
user would catch, with a message that says what was expected and what to do;
inputs other libraries mishandle (nested, sparse, quantized and meta tensors,
odd-strided NumPy views, masked arrays, failing DLPack producers) reach the
user as such errors, raised before anything is written."""

from __future__ import annotations

import contextlib
import errno
import os
import pickle
import socket
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import ml_dtypes
import numpy as np
import pytest

import interop
from interop.errors import path_error
from tests.helpers import Producer, run_python

# --------------------------------------------------------------------------- the classes

CLASSES = [
    (interop.InvalidTypeError, TypeError),
    (interop.InvalidValueError, ValueError),
    (interop.UnknownSettingError, AttributeError),
    (interop.NpyFormatError, ValueError),
    (interop.PathError, OSError),
    (interop.PathPermissionError, PermissionError),
    (interop.PathNotFoundError, FileNotFoundError),
    (interop.PathIsADirectoryError, IsADirectoryError),
    (interop.PathNotADirectoryError, NotADirectoryError),
    (interop.PathExistsError, FileExistsError),
    (interop.CudaAfterForkError, RuntimeError),
    (interop.CudaAfterForkError, interop.NoDeviceError),
    (interop.UsageError, RuntimeError),
]


@pytest.mark.parametrize(("cls", "builtin"), CLASSES, ids=lambda c: c.__name__)
def test_each_class_is_an_interop_error_and_its_builtin(cls, builtin):
    assert issubclass(cls, interop.InteropError)
    assert issubclass(cls, builtin)
    assert cls.__name__ in interop.__all__
    assert getattr(interop, cls.__name__) is cls


def test_every_exported_error_class_is_also_a_builtin_more_specific_than_exception():
    exported = [getattr(interop, name) for name in interop.__all__]
    errors = [c for c in exported if isinstance(c, type) and issubclass(c, interop.InteropError)]
    assert len(errors) >= 18
    for cls in errors:
        if cls is interop.InteropError:
            continue
        builtins = [b for b in cls.__mro__ if b.__module__ == "builtins"]
        assert builtins[0] not in (Exception, BaseException, object), cls


@pytest.mark.parametrize(
    ("code", "cls", "builtin"),
    [
        (errno.EACCES, interop.PathPermissionError, PermissionError),
        (errno.EPERM, interop.PathPermissionError, PermissionError),
        (errno.ENOENT, interop.PathNotFoundError, FileNotFoundError),
        (errno.EISDIR, interop.PathIsADirectoryError, IsADirectoryError),
        (errno.ENOTDIR, interop.PathNotADirectoryError, NotADirectoryError),
        (errno.EEXIST, interop.PathExistsError, FileExistsError),
        (errno.ENOSPC, interop.PathError, OSError),
        (None, interop.PathError, OSError),
    ],
)
def test_path_error_picks_the_oserror_subclass_of_the_errno(code, cls, builtin):
    exc = path_error(code, "save_npy cannot write 'a.npy': why", "a.npy")
    assert type(exc) is cls
    assert isinstance(exc, builtin)
    assert exc.errno == code
    assert exc.filename == "a.npy"
    assert "save_npy cannot write 'a.npy': why" in str(exc)


def test_errors_survive_pickling_as_dask_workers_send_them():
    for exc in [
        interop.InvalidValueError("expected x (got 'y')"),
        path_error(errno.EACCES, "save_npy expected a writable file", "/tmp/a.npy"),
        interop.NpyFormatError("'a.npy' is not a readable .npy file"),
    ]:
        back = pickle.loads(pickle.dumps(exc))
        assert type(back) is type(exc)
        assert str(back) == str(exc)


# --------------------------------------------------------------------------- the walk


@dataclass
class Case:
    """A public call with a bad argument, and what it must raise."""

    id: str
    builtin: type[BaseException]
    match: str  # a regular expression the message must contain
    call: Callable[[Any], Any]  # given pytest's tmp_path


def _torch():
    import torch

    return torch


@contextlib.contextmanager
def _quiet():
    """PyTorch warns once per process about prototype and beta features."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        yield


def _nested():
    th = _torch()
    with _quiet():
        return th.nested.nested_tensor([th.ones(2), th.ones(3)])


def _jagged():
    th = _torch()
    return th.nested.nested_tensor([th.ones(2), th.ones(3)], layout=th.jagged)


def _quantized():
    th = _torch()
    with _quiet():
        return th.quantize_per_tensor(th.ones(3), 0.1, 0, th.qint8)


def _complex32():
    th = _torch()
    with _quiet():
        return th.zeros(2, dtype=th.complex32)


def _csr():
    with _quiet():
        return _torch().eye(2).to_sparse_csr()


def _field_view():
    """A field of a structured array: byte strides of 5 for 4-byte ints."""
    return np.zeros(4, dtype=[("a", "u1"), ("b", "<i4")])["b"]


def _masked():
    return np.ma.masked_array([1.0, 2.0, 3.0], mask=[False, True, False])


_MADE: list[str] = []  # names of the files a case made itself, before its call


def _made(path):
    _MADE.append(path.name)
    return path


def _npy(tmp, name="a.npy", data=None, **kwargs):
    path = _made(tmp / name)
    np.save(path, np.ones((2, 3), np.float32) if data is None else data, **kwargs)
    return path


def _file(tmp, name, content):
    path = _made(tmp / name)
    path.write_bytes(content)
    return path


def _directory(path):
    _made(path).mkdir()
    return path


def _loop(tmp):
    path = _made(tmp / "loop.npy")
    os.symlink(path, path)
    return path


def _read_only(a):
    a.flags.writeable = False
    return a


class _FailingProducer:
    """A DLPack producer whose export fails."""

    def __dlpack__(self, **kwargs):
        raise RuntimeError("the export broke")

    def __dlpack_device__(self):
        return (1, 0)


class _BadDevice:
    def __dlpack__(self, **kwargs):
        raise AssertionError("never called")

    def __dlpack_device__(self):
        return "cpu"


class _OpenCL:
    def __dlpack__(self, **kwargs):
        raise AssertionError("never called")

    def __dlpack_device__(self):
        return (4, 0)  # kDLOpenCL


def _socket_path(tmp):
    path = _made(tmp / "s.npy")
    sock = socket.socket(socket.AF_UNIX)
    _SOCKETS.append(sock)
    sock.bind(str(path))
    return path


_SOCKETS: list[socket.socket] = []
_A = np.arange(12.0).reshape(3, 4)
_DENSE = "expected a dense \\(strided\\) tensor"

CASES = [
    # ---- to_numpy
    Case(
        "to_numpy-not-an-array",
        TypeError,
        "to_numpy expected a NumPy array",
        lambda t: interop.to_numpy(object()),
    ),
    Case(
        "to_numpy-copy-str",
        TypeError,
        "expected copy to be None, True or False",
        lambda t: interop.to_numpy(_A, copy="no"),
    ),
    Case(
        "to_numpy-nested",
        TypeError,
        f"{_DENSE} .got a nested tensor.*to_padded_tensor",
        lambda t: interop.to_numpy(_nested()),
    ),
    Case(
        "to_numpy-jagged",
        TypeError,
        f"{_DENSE} .got a nested tensor, layout torch.jagged",
        lambda t: interop.to_numpy(_jagged()),
    ),
    Case(
        "to_numpy-sparse",
        TypeError,
        f"{_DENSE} .got layout torch.sparse_coo.*to_dense",
        lambda t: interop.to_numpy(_torch().eye(3).to_sparse()),
    ),
    Case(
        "to_numpy-meta",
        ValueError,
        "got a meta tensor.*no data.*empty_like",
        lambda t: interop.to_numpy(_torch().empty(3, device="meta")),
    ),
    Case(
        "to_numpy-quantized",
        TypeError,
        r"got torch.qint8\); take its values with t.dequantize\(\)",
        lambda t: interop.to_numpy(_quantized()),
    ),
    Case(
        "to_numpy-complex32",
        TypeError,
        r"got torch.complex32\); convert first",
        lambda t: interop.to_numpy(_complex32()),
    ),
    Case(
        "to_numpy-conj-copy-false",
        BufferError,
        "copy=False, but a tensor with the conjugate bit",
        lambda t: interop.to_numpy(_torch().ones(2, dtype=_torch().complex64).conj(), copy=False),
    ),
    Case(
        "to_numpy-failing-producer",
        ValueError,
        "DLPack export holds its data .*RuntimeError: the export broke.*numpy.asarray",
        lambda t: interop.to_numpy(_FailingProducer()),
    ),
    Case(
        "to_numpy-odd-producer",
        ValueError,
        "DLPack export holds its data.*multiple of itemsize",
        lambda t: interop.to_numpy(Producer(_field_view())),
    ),
    Case(
        "to_numpy-bad-dlpack-device",
        ValueError,
        r"expected __dlpack_device__\(\) to return \(device type, device index\)",
        lambda t: interop.to_numpy(_BadDevice()),
    ),
    Case(
        "to_numpy-opencl",
        ValueError,
        "expected CPU or CUDA data .got DLPack device 4",
        lambda t: interop.to_numpy(_OpenCL()),
    ),
    # ---- to_torch
    Case(
        "to_torch-not-an-array",
        TypeError,
        "to_torch expected a NumPy array",
        lambda t: interop.to_torch([1, 2]),
    ),
    Case(
        "to_torch-device-bogus",
        ValueError,
        "expected 'cpu', 'cuda' or 'cuda:N' .got 'bogus'",
        lambda t: interop.to_torch(_A, device="bogus"),
    ),
    Case(
        "to_torch-device-bool",
        TypeError,
        "expected a device .got True",
        lambda t: interop.to_torch(_A, device=True),
    ),
    Case(
        "to_torch-device-float",
        TypeError,
        "expected a device: 'cpu'.*got builtins.float",
        lambda t: interop.to_torch(_A, device=1.5),
    ),
    Case(
        "to_torch-device-negative",
        ValueError,
        "expected a CUDA device index >= 0 .got -1",
        lambda t: interop.to_torch(_A, device=-1),
    ),
    Case(
        "to_torch-copy-int",
        TypeError,
        "expected copy to be None, True or False .got 1",
        lambda t: interop.to_torch(_A, copy=1),
    ),
    Case(
        "to_torch-strings",
        TypeError,
        "expected a dtype PyTorch supports",
        lambda t: interop.to_torch(np.array(["a", "b"])),
    ),
    Case(
        "to_torch-odd-strides-copy-false",
        BufferError,
        r"byte strides \(5,\) that are not multiples of its itemsize 4",
        lambda t: interop.to_torch(_field_view(), copy=False),
    ),
    Case(
        "to_torch-negative-copy-false",
        BufferError,
        "negative strides",
        lambda t: interop.to_torch(_A[::-1], copy=False),
    ),
    Case(
        "to_torch-byte-order-copy-false",
        BufferError,
        "non-native byte order \\('>f8'\\)",
        lambda t: interop.to_torch(_A.astype(">f8"), copy=False),
    ),
    Case(
        "to_torch-bf16-byte-order-copy-false",
        BufferError,
        "non-native byte order \\('>bfloat16'\\)",
        lambda t: interop.to_torch(
            _A.astype(ml_dtypes.bfloat16).astype(np.dtype(ml_dtypes.bfloat16).newbyteorder(">")),
            copy=False,
        ),
    ),
    Case("to_torch-nested", TypeError, _DENSE, lambda t: interop.to_torch(_nested())),
    Case(
        "to_torch-meta",
        ValueError,
        "meta tensor",
        lambda t: interop.to_torch(_torch().empty(2, device="meta")),
    ),
    Case(
        "to_torch-failing-producer",
        ValueError,
        "to_torch expected an object whose DLPack export",
        lambda t: interop.to_torch(_FailingProducer()),
    ),
    # ---- to_cupy (argument checks come before the device check)
    Case(
        "to_cupy-cpu",
        ValueError,
        "to_cupy expected a CUDA device .got 'cpu'.*to_numpy",
        lambda t: interop.to_cupy(_A, device="cpu"),
    ),
    Case(
        "to_cupy-not-an-array",
        TypeError,
        "to_cupy expected a NumPy array",
        lambda t: interop.to_cupy("abc"),
    ),
    Case("to_cupy-nested", TypeError, _DENSE, lambda t: interop.to_cupy(_nested())),
    Case(
        "to_cupy-meta",
        ValueError,
        "meta tensor",
        lambda t: interop.to_cupy(_torch().empty(2, device="meta")),
    ),
    # ---- copy_to_host
    Case(
        "copy_to_host-not-an-array",
        TypeError,
        "copy_to_host expected a NumPy array",
        lambda t: interop.copy_to_host(3),
    ),
    Case(
        "copy_to_host-out-list",
        TypeError,
        "expected out to be a writable NumPy array",
        lambda t: interop.copy_to_host(_A, [0] * 12),
    ),
    Case(
        "copy_to_host-out-shape",
        ValueError,
        r"expected out of shape \(3, 4\) \(got \(4, 3\)\)",
        lambda t: interop.copy_to_host(_A, np.empty((4, 3))),
    ),
    Case(
        "copy_to_host-out-dtype",
        ValueError,
        "expected out of dtype float64 .got float32.; allocate out",
        lambda t: interop.copy_to_host(_A, np.empty((3, 4), np.float32)),
    ),
    Case(
        "copy_to_host-out-byte-order",
        ValueError,
        "the byte order differs",
        lambda t: interop.copy_to_host(_A, np.empty((3, 4), ">f8")),
    ),
    Case(
        "copy_to_host-out-read-only",
        ValueError,
        "expected a writable out",
        lambda t: interop.copy_to_host(_A, _read_only(np.empty((3, 4)))),
    ),
    Case(
        "copy_to_host-out-overlaps",
        ValueError,
        "expected out not to overlap the source",
        lambda t: (lambda b: interop.copy_to_host(b[:, :4], b[:, 1:]))(np.zeros((3, 5))),
    ),
    Case(
        "copy_to_host-chunk-zero",
        ValueError,
        "expected chunk_bytes between 1 and",
        lambda t: interop.copy_to_host(_A, chunk_bytes=0),
    ),
    Case(
        "copy_to_host-chunk-huge",
        ValueError,
        r"\(1 GiB\) \(got 1099511627776\)",
        lambda t: interop.copy_to_host(_A, chunk_bytes=1 << 40),
    ),
    Case(
        "copy_to_host-chunk-str",
        TypeError,
        "expected chunk_bytes to be an integer",
        lambda t: interop.copy_to_host(_A, chunk_bytes="4096"),
    ),
    Case(
        "copy_to_host-chunk-bool",
        TypeError,
        "a bool",
        lambda t: interop.copy_to_host(_A, chunk_bytes=True),
    ),
    Case(
        "copy_to_host-progress",
        TypeError,
        "expected progress to be True, False or a callable",
        lambda t: interop.copy_to_host(_A, progress="yes"),
    ),
    Case("copy_to_host-nested", TypeError, _DENSE, lambda t: interop.copy_to_host(_nested())),
    Case("copy_to_host-sparse", TypeError, _DENSE, lambda t: interop.copy_to_host(_csr())),
    Case(
        "copy_to_host-meta",
        ValueError,
        "meta tensor",
        lambda t: interop.copy_to_host(_torch().empty(2, device="meta")),
    ),
    Case(
        "copy_to_host-quantized",
        TypeError,
        "dequantize",
        lambda t: interop.copy_to_host(_quantized()),
    ),
    Case(
        "copy_to_host_async-out",
        ValueError,
        "expected out of shape",
        lambda t: interop.copy_to_host_async(_A, np.empty(3)),
    ),
    # ---- copy_to_device (argument checks come before the device check)
    Case(
        "copy_to_device-not-an-array",
        TypeError,
        "copy_to_device expected a NumPy array",
        lambda t: interop.copy_to_device({}),
    ),
    Case(
        "copy_to_device-device-cpu",
        ValueError,
        "expected a CUDA device .got 'cpu'.*copy_to_host",
        lambda t: interop.copy_to_device(_A, device="cpu"),
    ),
    Case(
        "copy_to_device-out-numpy",
        TypeError,
        "expected out to be a CuPy array or a CUDA torch tensor",
        lambda t: interop.copy_to_device(_A, np.empty((3, 4))),
    ),
    Case(
        "copy_to_device-out-cpu-tensor",
        TypeError,
        "expected out to be a CuPy array or a CUDA torch tensor",
        lambda t: interop.copy_to_device(_A, _torch().empty(3, 4)),
    ),
    Case(
        "copy_to_device-chunk",
        ValueError,
        "expected chunk_bytes between",
        lambda t: interop.copy_to_device(_A, chunk_bytes=-1),
    ),
    Case(
        "copy_to_device_async-progress",
        TypeError,
        "expected progress",
        lambda t: interop.copy_to_device_async(_A, progress=3),
    ),
    # ---- save_npy
    Case(
        "save_npy-not-an-array",
        TypeError,
        "save_npy expected a NumPy array",
        lambda t: interop.save_npy("abc", t / "a.npy"),
    ),
    Case(
        "save_npy-path-int",
        TypeError,
        "save_npy expected path to be a str or os.PathLike .got int 3",
        lambda t: interop.save_npy(_A, 3),
    ),
    Case(
        "save_npy-path-empty",
        ValueError,
        "save_npy expected a file path .got ''.; pass a file name",
        lambda t: interop.save_npy(_A, ""),
    ),
    Case(
        "save_npy-directory",
        IsADirectoryError,
        "a directory.; pass a file name inside it",
        lambda t: interop.save_npy(_A, _directory(t / "d.npy")),
    ),
    Case(
        "save_npy-trailing-separator",
        IsADirectoryError,
        "which names a directory.; add a file name",
        lambda t: interop.save_npy(_A, f"{t}/sub/"),
    ),
    Case(
        "save_npy-missing-directory",
        FileNotFoundError,
        "does not exist; create it first",
        lambda t: interop.save_npy(_A, t / "nope" / "a.npy"),
    ),
    Case(
        "save_npy-under-a-file",
        NotADirectoryError,
        "is a file, not a directory",
        lambda t: interop.save_npy(_A, _npy(t, "f.npy") / "a.npy"),
    ),
    Case(
        "save_npy-socket",
        OSError,
        "it is a socket; save to a regular file",
        lambda t: interop.save_npy(_A, _socket_path(t)),
    ),
    Case(
        "save_npy-name-too-long",
        OSError,
        "use a shorter name",
        lambda t: interop.save_npy(_A, t / ("x" * 300 + ".npy")),
    ),
    Case(
        "save_npy-symlink-loop",
        OSError,
        "Too many levels of symbolic links",
        lambda t: interop.save_npy(_A, _loop(t)),
    ),
    Case(
        "save_npy-object-dtype",
        TypeError,
        "save_npy expected numeric data",
        lambda t: interop.save_npy(np.array([{}, None]), t / "a.npy"),
    ),
    Case(
        "save_npy-masked",
        TypeError,
        r"numpy.ma.MaskedArray.*x.filled\(fill_value\)",
        lambda t: interop.save_npy(_masked(), t / "a.npy"),
    ),
    Case("save_npy-nested", TypeError, _DENSE, lambda t: interop.save_npy(_nested(), t / "a.npy")),
    Case(
        "save_npy-sparse",
        TypeError,
        _DENSE,
        lambda t: interop.save_npy(_torch().eye(2).to_sparse(), t / "a.npy"),
    ),
    Case(
        "save_npy-meta",
        ValueError,
        "meta tensor",
        lambda t: interop.save_npy(_torch().empty(2, device="meta"), t / "a.npy"),
    ),
    Case(
        "save_npy-quantized",
        TypeError,
        "dequantize",
        lambda t: interop.save_npy(_quantized(), t / "a.npy"),
    ),
    Case(
        "save_npy-complex32",
        TypeError,
        "complex64",
        lambda t: interop.save_npy(_complex32(), t / "a.npy"),
    ),
    Case(
        "save_npy-chunk",
        TypeError,
        "expected chunk_bytes to be an integer",
        lambda t: interop.save_npy(_A, t / "a.npy", chunk_bytes=1.5),
    ),
    # ---- load_npy
    Case(
        "load_npy-path-int",
        TypeError,
        "load_npy expected path to be a str or os.PathLike .got int 7",
        lambda t: interop.load_npy(7),
    ),
    Case(
        "load_npy-missing",
        FileNotFoundError,
        "load_npy cannot read .*nope.npy.*No such file",
        lambda t: interop.load_npy(t / "nope.npy"),
    ),
    Case(
        "load_npy-directory",
        IsADirectoryError,
        "load_npy cannot read",
        lambda t: interop.load_npy(t),
    ),
    Case(
        "load_npy-not-npy",
        ValueError,
        "is not a readable .npy file",
        lambda t: interop.load_npy(_file(t, "x.npy", b"hello")),
    ),
    Case(
        "load_npy-truncated",
        ValueError,
        "is truncated",
        lambda t: interop.load_npy(_file(t, "a.npy", _npy(t).read_bytes()[:-4])),
    ),
    Case(
        "load_npy-objects",
        ValueError,
        "holds Python objects",
        lambda t: interop.load_npy(_npy(t, "o.npy", np.array([{}]), allow_pickle=True)),
    ),
    Case(
        "load_npy-device-bogus",
        ValueError,
        "load_npy expected device to be None or 'cpu'",
        lambda t: interop.load_npy(_npy(t), device="CPU"),
    ),
    Case(
        "load_npy-device-float",
        TypeError,
        "load_npy expected device to be",
        lambda t: interop.load_npy(_npy(t), device=0.5),
    ),
    Case(
        "load_npy-out-list",
        TypeError,
        "expected out for .* to be a NumPy array",
        lambda t: interop.load_npy(_npy(t), [0.0] * 6),
    ),
    Case(
        "load_npy-out-shape",
        ValueError,
        r"with shape \(2, 3\) and dtype float32 \(got shape \(3, 2\)",
        lambda t: interop.load_npy(_npy(t), np.empty((3, 2), np.float32)),
    ),
    Case(
        "load_npy-out-read-only",
        ValueError,
        "expected a writable out",
        lambda t: interop.load_npy(_npy(t), _read_only(np.empty((2, 3), np.float32))),
    ),
    Case(
        "load_npy-out-and-device",
        ValueError,
        "expected device to match out",
        lambda t: interop.load_npy(_npy(t), np.empty((2, 3), np.float32), device="cuda"),
    ),
    Case(
        "load_npy-chunk",
        ValueError,
        "expected chunk_bytes between",
        lambda t: interop.load_npy(_npy(t), chunk_bytes=0),
    ),
    # ---- config
    Case(
        "config-set-unknown",
        AttributeError,
        "expected a setting of interop.config, one of",
        lambda t: interop.config.set(chunk_size=1).__enter__(),
    ),
    Case("config-get-unknown", AttributeError, "got 'bogus'", lambda t: interop.config.bogus),
    Case(
        "config-assign-unknown",
        AttributeError,
        "got 'bogus'",
        lambda t: setattr(interop.config, "bogus", 1),
    ),
    Case(
        "config-assign-str",
        TypeError,
        "expected num_buffers to be an integer",
        lambda t: setattr(interop.config, "num_buffers", "4"),
    ),
    Case(
        "config-assign-zero",
        ValueError,
        "expected host_threads between 1 and 256 .got 0",
        lambda t: setattr(interop.config, "host_threads", 0),
    ),
    Case(
        "config-set-bool",
        TypeError,
        "a bool",
        lambda t: interop.config.set(num_buffers=False).__enter__(),
    ),
    # ---- stream (resolved before any device check)
    Case(
        "stream-str",
        TypeError,
        "expected a torch.cuda.Stream, a cupy.cuda.Stream",
        lambda t: interop.stream("s").__enter__(),
    ),
    Case(
        "stream-none",
        TypeError,
        "expected a torch.cuda.Stream",
        lambda t: interop.stream(None).__enter__(),
    ),
    Case(
        "stream-negative",
        ValueError,
        "expected a stream handle >= 0",
        lambda t: interop.stream(-5).__enter__(),
    ),
    Case(
        "stream-bad-protocol",
        TypeError,
        r"expected __cuda_stream__\(\) to return \(version, handle\)",
        lambda t: interop.stream(
            type("S", (), {"__cuda_stream__": lambda self: "x"})()
        ).__enter__(),
    ),
]


def _listing(path) -> set[str]:
    return {p.name for p in path.rglob("*")}


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_a_bad_argument_raises_an_interop_error_that_is_also_the_builtin(case, tmp_path):
    _MADE.clear()
    try:
        with pytest.raises(interop.InteropError, match=case.match) as info:
            case.call(tmp_path)
    finally:
        for sock in _SOCKETS:
            sock.close()
        _SOCKETS.clear()
    assert isinstance(info.value, case.builtin), type(info.value).__mro__
    # refused before anything was written: no file but the case's own setup
    assert _listing(tmp_path) == set(_MADE)


# ------------------------------------------------------------------ inputs others mishandle


def test_odd_strided_views_are_copied_for_pytorch_with_copy_none():
    field = _field_view()
    field[:] = [1, -2, 3, -4]
    t = interop.to_torch(field)
    assert t.tolist() == [1, -2, 3, -4]
    assert t.is_contiguous()
    field[0] = 99  # a copy, as promised: the tensor keeps its values
    assert t[0].item() == 1
    assert interop.to_torch(field, copy=True).tolist() == [99, -2, 3, -4]


def test_size_one_axes_with_odd_strides_are_shared_not_copied():
    buf = np.arange(10, dtype=np.int32)
    a = np.lib.stride_tricks.as_strided(buf, (1, 3), (3, 4))  # stride 3 on a 1-long axis
    t = interop.to_torch(a, copy=False)  # the odd stride is never used: shareable
    assert t.tolist() == [[0, 1, 2]]
    assert t.data_ptr() == buf.ctypes.data
    empty = np.lib.stride_tricks.as_strided(buf, (0, 3), (5, 3))
    assert tuple(interop.to_torch(empty, copy=False).shape) == (0, 3)
    bf16 = np.arange(3).astype(ml_dtypes.bfloat16).reshape(1, 3)[::-1]  # stride -6, length 1
    assert interop.to_torch(bf16, copy=False).float().tolist() == [[0.0, 1.0, 2.0]]


def test_big_endian_bfloat16_crosses_to_pytorch_and_into_files(tmp_path):
    want = np.array([1.5, -2.0, 3.25], ml_dtypes.bfloat16)
    big = want.astype(want.dtype.newbyteorder(">"))
    assert interop.to_torch(big).float().tolist() == [1.5, -2.0, 3.25]
    path = interop.save_npy(big, tmp_path / "b.npy")
    for loaded in (interop.load_npy(path), np.load(path)):
        assert loaded.dtype == want.dtype  # the file holds it in native order, named
        assert loaded.tobytes() == want.tobytes()


def test_one_byte_float8_flagged_big_endian_is_shared_without_a_copy():
    a = np.arange(4).astype(ml_dtypes.float8_e4m3fn)
    flagged = a.view(a.dtype.newbyteorder(">"))  # one byte: the flag changes nothing
    t = interop.to_torch(flagged, copy=False)
    assert t.data_ptr() == a.ctypes.data
    assert t.float().tolist() == [0.0, 1.0, 2.0, 3.0]


def test_a_masked_array_is_refused_by_save_npy_as_numpy_save_refuses_it(tmp_path):
    with pytest.raises(NotImplementedError):  # numpy.save on a real file
        np.save(tmp_path / "numpy.npy", _masked())
    with pytest.raises(TypeError, match="holds no mask") as info:
        interop.save_npy(_masked(), tmp_path / "m.npy")
    assert isinstance(info.value, interop.InvalidTypeError)
    assert not (tmp_path / "m.npy").exists()
    # the two ways the message offers both work
    m = _masked()
    interop.save_npy(m.filled(0.0), tmp_path / "filled.npy")
    assert np.load(tmp_path / "filled.npy").tolist() == [1.0, 0.0, 3.0]
    interop.save_npy(np.ma.getmaskarray(m), tmp_path / "mask.npy")
    assert np.load(tmp_path / "mask.npy").tolist() == [False, True, False]


def test_a_nested_tensor_message_offers_fixes_that_work():
    nested = _nested()
    padded = _torch().nested.to_padded_tensor(nested, 0.0)
    assert interop.to_numpy(padded).tolist() == [[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]]
    assert [interop.to_numpy(c).tolist() for c in nested.unbind()] == [[1.0] * 2, [1.0] * 3]


def test_a_quantized_tensor_message_offers_fixes_that_work():
    q = _quantized()
    assert interop.to_numpy(q.dequantize()).tolist() == pytest.approx([1.0, 1.0, 1.0])
    assert interop.to_numpy(q.int_repr()).tolist() == [10, 10, 10]


_WRITE_FAILS = """
import resource, signal
import numpy as np, interop
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG
resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))
path = {path!r}
try:
    interop.save_npy(np.ones(100_000), path)
except OSError as exc:
    print(type(exc).__name__, isinstance(exc, interop.InteropError), exc.errno)
    print(exc)
"""


def test_a_write_that_fails_part_way_names_the_file_and_leaves_none(tmp_path):
    path = tmp_path / "big.npy"
    proc = run_python(_WRITE_FAILS.format(path=str(path)))
    assert proc.returncode == 0, proc.stderr
    kind, message = proc.stdout.splitlines()
    assert kind == f"PathError True {errno.EFBIG}"
    assert f"save_npy could not write {str(path)!r}: File too large" in message
    assert f"no file was left under {str(path)!r}" in message
    assert _listing(tmp_path) == set()  # nor a temporary


def test_a_misaligned_view_is_copied_for_pytorch_never_shared():
    # PyTorch's kernels crash the interpreter on misaligned complex128 (they
    # assume 16-byte elements): in a subprocess, so a regression is a failure.
    proc = run_python(
        """
        import numpy as np, interop
        raw = np.zeros(1024 + 16, np.uint8)
        start = (-raw.ctypes.data) % 16 + 8  # 8 bytes past a 16-byte boundary
        a = np.ndarray((4, 4), np.complex128, buffer=raw, offset=start)
        a[...] = np.arange(16).reshape(4, 4) * (1 + 1j)
        t = interop.to_torch(a)
        print(t.data_ptr() % 16, t.contiguous().sum().item() == a.sum())
        try:
            interop.to_torch(a, copy=False)
        except interop.CopyRequiredError as exc:
            print("refused:", "not a multiple of its itemsize 16" in str(exc))
        """
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split("\n")[:2] == ["0 True", "refused: True"]
