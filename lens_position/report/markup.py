"""The report's HTML pieces shared by its sections: how a verdict is styled.

A verdict cell carries a CSS class the report's style sheet colours: ``yes`` (the claim
holds), ``no`` (it does not), ``maybe`` (inconclusive), ``na`` (anything else: not measured).
"""

from __future__ import annotations

from lens_position.analyses.claims import FAILS, HOLDS, INCONCLUSIVE

VERDICT_CLASS = {HOLDS: "yes", FAILS: "no", INCONCLUSIVE: "maybe"}


def verdict_class(verdict: str) -> str:
    """The CSS class of a verdict of :mod:`lens_position.analyses.claims` (``"na"`` for none)."""
    return VERDICT_CLASS.get(verdict, "na")
