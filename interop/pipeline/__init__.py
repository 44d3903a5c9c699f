"""The slot pipeline: chunked copies between host and device memory.

``start(request)`` runs a ``TransferRequest``; docs/pipeline.md maps the modules.
"""

from __future__ import annotations
