"""Dask arrays of NumPy or CuPy blocks saved to and loaded from one ``.npy`` file on the
workers (needs the ``dask`` extra; the code is in :mod:`interop.io.dask`)."""

from __future__ import annotations

from .io.dask import SaveError, load_npy, save_npy

__all__ = ["SaveError", "load_npy", "save_npy"]
