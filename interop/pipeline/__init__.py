"""The slot pipeline: chunked copies between host and device memory.

``plan``      which chunks, how large the staging slots are
``progress``  the progress bar or callback, in completed bytes
``future``    :class:`Transfer`, the future a running copy is
``ring``      host staging rings (pinned memory) and their cache
``backend``   the small device interface the schedule talks to
``schedule``  the ring-of-slots schedule, once for both directions
``cuda``      the CUDA backend (CuPy runtime calls)
``host``      the host backend: a CPU stream that enforces CUDA's rules
``hostcopy``  the host engine: host-to-host copies on a thread pool
``trace``     where a transfer's time goes (device steps against host steps)
"""

from __future__ import annotations
