"""Ratios with their direction, and the targets they are judged against.

Every figure the benchmark judges is a ratio of two measurements from the
same run: a time ratio (lower is better: "1.29x the time of
numpy.from_dlpack"), a throughput ratio (higher is better: "1.14x the
throughput of numpy.copyto") or a memory ratio (extra memory over a bound:
"0.50x the ring size"). A row meets its target when every ratio that carries
a target meets it; a smoke run (``--quick``) judges none.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable
from typing import Any

__all__ = ["QUANTITIES", "Ratio", "row_met"]

#: What each kind of ratio compares, and which way is better.
QUANTITIES = {
    "time": "lower is better",
    "throughput": "higher is better",
    "memory": "lower is better",
}


@dataclasses.dataclass(frozen=True)
class Ratio:
    """``value = of / to`` for one quantity, with an optional target.

    Attributes
    ----------
    of : str
        What was measured, e.g. ``"to_numpy"`` or ``"extra host RSS of save_npy"``.
    quantity : str
        ``"time"``, ``"throughput"`` or ``"memory"`` (see :data:`QUANTITIES`).
    to : str
        What it is compared with, e.g. ``"numpy.from_dlpack"`` or, for
        memory, the bound in words.
    value : float or None
        The ratio; None where either side was not measured or is zero.
    at_most, at_least : float, optional
        The target, if this ratio is judged.
    """

    of: str
    quantity: str
    to: str
    value: float | None
    at_most: float | None = None
    at_least: float | None = None

    def __post_init__(self) -> None:
        if self.quantity not in QUANTITIES:
            raise ValueError(f"expected a quantity in {sorted(QUANTITIES)} (got {self.quantity!r})")

    @classmethod
    def between(
        cls,
        of: str,
        quantity: str,
        to: str,
        ours: float | None,
        reference: float | None,
        *,
        at_most: float | None = None,
        at_least: float | None = None,
    ) -> Ratio:
        """The ratio ``ours / reference``; None when it is not a finite number."""
        value = None
        if ours is not None and reference:
            r = ours / reference
            value = r if math.isfinite(r) else None
        return cls(of, quantity, to, value, at_most, at_least)

    @property
    def target(self) -> str | None:
        """The target in words (``"<= 2x"``, ``">= 0.9x"``), or None."""
        if self.at_most is not None:
            return f"<= {self.at_most:g}x"
        if self.at_least is not None:
            return f">= {self.at_least:g}x"
        return None

    @property
    def met(self) -> bool | None:
        """Whether the target is met; None without a target, False without a value."""
        if self.target is None:
            return None
        if self.value is None:
            return False
        if self.at_most is not None and self.value > self.at_most:
            return False
        return not (self.at_least is not None and self.value < self.at_least)

    def record(self, judged: bool = True) -> dict[str, Any]:
        """The JSON form; ``met`` is None when not ``judged`` (a smoke run)."""
        return {
            "of": self.of,
            "quantity": self.quantity,
            "to": self.to,
            "value": self.value,
            "target": self.target,
            "met": self.met if judged else None,
        }


def row_met(ratios: Iterable[Ratio], judged: bool = True) -> bool | None:
    """A row's verdict: every targeted ratio met; None for a reference row or a smoke run."""
    verdicts = [r.met for r in ratios if r.target is not None]
    if not judged or not verdicts:
        return None
    return all(verdicts)
