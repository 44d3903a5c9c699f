"""Griffe extension for the API reference: Sphinx roles in docstrings become links.

interop's docstrings use numpydoc with Sphinx roles (``:func:`interop.stream```).
mkdocstrings does not read roles, so they would show as ``:func:`` text. Once the
package is loaded, this rewrites every role in every docstring:

* a role naming a public object that the API reference documents (a name in
  ``interop.__all__`` or ``interop.dask.__all__``, a public member of a
  documented class) becomes a cross-reference, ``[`name`][interop.name]``, which
  mkdocstrings turns into a link (``~`` shows the last component only);
* any other role (private helpers, other libraries) becomes inline code.

Short names resolve as Python would read them where the docstring is: in
``interop.dask``, ``:func:`save_npy``` is ``interop.dask.save_npy``; in a
class, ``:meth:`cancel``` is that class's method; elsewhere a short name is
looked up in ``interop.__all__``. Only identifiers the reference documents are
linked, so ``mkdocs build --strict`` never meets an unresolved link.
"""

from __future__ import annotations

import re
from typing import Any

from griffe import Extension

_ROLE = re.compile(r":(?:py:)?(?:func|class|meth|attr|mod|data|exc|obj):`(~?)([^`]+)`")

# Classes whose public members the API reference shows (api.md's ::: blocks).
_CLASSES_WITH_MEMBERS = ("Transfer", "config.Config")


def _names(module: Any) -> list[str]:
    return [str(name) for name in (module.exports or ())]


def _documented(pkg: Any) -> tuple[set[str], dict[str, str], dict[str, str]]:
    """Every identifier the API reference has an anchor for, and the short names
    that resolve to them: (identifiers, names in interop, names in interop.dask)."""
    top = {name: f"interop.{name}" for name in _names(pkg) if not name.startswith("_")}
    dask = {name: f"interop.dask.{name}" for name in _names(pkg["dask"])}
    identifiers = set(top.values()) | set(dask.values())
    for path in _CLASSES_WITH_MEMBERS:
        cls = pkg[path]
        for name, member in cls.members.items():
            if not name.startswith("_") and member.docstring is not None:
                identifiers.add(f"interop.{path}.{name}")
                top.setdefault(f"{path.rsplit('.', 1)[-1]}.{name}", f"interop.{path}.{name}")
    # ``interop.config`` is the one instance of Config: its entry is the class's.
    top["config"] = top["Config"] = "interop.config.Config"
    identifiers.discard("interop.config")
    identifiers.add("interop.config.Config")
    return identifiers, top, dask


def _objects(obj: Any) -> Any:
    """``obj`` and every object defined in it (aliases, i.e. imports, left out)."""
    yield obj
    for member in obj.members.values():
        if not member.is_alias:
            yield from _objects(member)


class SphinxRoles(Extension):
    """Rewrite Sphinx roles as cross-references (documented names) or inline code."""

    def on_package(self, *, pkg: Any, **kwargs: Any) -> None:
        if pkg.name != "interop":
            return
        identifiers, top, dask = _documented(pkg)
        for obj in _objects(pkg):
            if obj.docstring is not None:
                obj.docstring.value = _ROLE.sub(
                    lambda m, o=obj: self._rewrite(m, o, identifiers, top, dask),
                    obj.docstring.value,
                )

    @staticmethod
    def _rewrite(
        match: re.Match[str],
        obj: Any,
        identifiers: set[str],
        top: dict[str, str],
        dask: dict[str, str],
    ) -> str:
        tilde, target = match.groups()
        shown = target.rsplit(".", 1)[-1] if tilde else target
        candidates = [target]
        if obj.path.startswith(("interop.dask", "interop.io.dask")):
            candidates.append(dask.get(target, ""))
        if obj.is_class or (obj.parent is not None and obj.parent.is_class):
            cls = obj if obj.is_class else obj.parent
            candidates.append(f"{cls.path}.{target}")
            if cls.path.startswith("interop.pipeline.future.Transfer"):
                candidates.append(f"interop.Transfer.{target}")
        candidates.append(top.get(target, ""))
        # A full path into a private module (``~interop.errors.TransferError``)
        # names the public object of the same name.
        candidates.append(top.get(target.rsplit(".", 1)[-1], "") if "." in target else "")
        for identifier in candidates:
            if identifier in identifiers:
                return f"[``{shown}``][{identifier}]"
        return f"``{shown}``"
