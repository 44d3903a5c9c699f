"""The slot pipeline: chunked copies between host and device memory.

``request``   :class:`TransferRequest`: what a copy moves, where and how
``start``     where a request enters: ``start(request) -> Transfer``
``plan``      which chunks, how large the staging slots are (the one chunker)
``progress``  the progress bar or callback, in completed bytes
``future``    :class:`Transfer`, the future a running copy is
``ring``      host staging rings (pinned memory) and their cache
``backend``   the small device interface the schedule talks to, and ``HostStage``
``schedule``  the ring-of-slots schedule, once for both directions
``cuda``      the CUDA backend (CuPy runtime calls)
``hostcopy``  the host stages of host arrays, and the host-to-host engine
``trace``     where a transfer's time goes (device steps against host steps)
"""

from __future__ import annotations
