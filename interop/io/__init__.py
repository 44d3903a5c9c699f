"""Files: the ``.npy`` format, where a saved file goes, save/load, Dask.

``_format``      the ``.npy`` header and where an array's bytes lie in the file
``destination``  the atomic-replace policy of every save
``npy``          :func:`interop.save_npy` / :func:`interop.load_npy`
``dask``         :mod:`interop.dask`'s implementation (imports dask)
"""
