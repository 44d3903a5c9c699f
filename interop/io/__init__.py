"""Files: the ``.npy`` format (``_format``), where a save writes (``destination``,
``_replaced``), ``save_npy``/``load_npy`` (``npy``) and :mod:`interop.dask` (``dask``)."""
