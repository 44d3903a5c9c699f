"""Save and load dask arrays of NumPy or CuPy blocks as one ``.npy`` file, on
the workers (the documented module path; the code is in :mod:`interop.io.dask`).

``import interop.dask`` needs the ``dask`` extra; ``import interop`` never
imports dask.
"""

from __future__ import annotations

from .io.dask import SaveError, load_npy, save_npy

__all__ = ["SaveError", "load_npy", "save_npy"]
