"""Files: the ``.npy`` format, where a saved file goes, save/load, Dask.

``_format``      the ``.npy`` header, where an array's bytes lie, the file stages
``destination``  the atomic-replace policy of every save
``_replaced``    replaced files, freed by a background thread
``npy``          :func:`interop.save_npy` / :func:`interop.load_npy`
``dask``         :mod:`interop.dask`'s implementation (imports dask)
"""
