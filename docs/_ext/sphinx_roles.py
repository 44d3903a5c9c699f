"""Griffe extension for the API reference: Sphinx roles in docstrings become code.

interop's docstrings use numpydoc with Sphinx roles (``:func:`interop.stream```).
mkdocstrings does not read roles, so they would show as ``:func:`` text. This
turns ``:role:`name``` into ```name``` and ``:role:`~a.b.name``` into ```name```
before the docstrings are parsed.
"""

from __future__ import annotations

import re
from typing import Any

from griffe import Extension

_ROLE = re.compile(r":(?:py:)?(?:func|class|meth|attr|mod|data|exc|obj):`(~?)([^`]+)`")


def _plain(match: re.Match[str]) -> str:
    tilde, target = match.groups()
    return f"``{target.rsplit('.', 1)[-1] if tilde else target}``"


class SphinxRoles(Extension):
    """Rewrite Sphinx roles as inline code in every loaded docstring."""

    def on_instance(self, *, obj: Any, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = _ROLE.sub(_plain, obj.docstring.value)
