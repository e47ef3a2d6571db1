"""Position hygiene: is every position what the user thinks it is, before anything is measured.

The mistakes TransformerLens users file most often as silent wrong results are about position 0
and the position ids: a BOS prepended twice (a text that already starts with it, tokenised with
``prepend_bos=True``), a BOS left out where the model was trained with one, a BOS in the middle of
a row (documents concatenated), rows padded so that position ids no longer count from 0 (left
padding), a position-id tensor that does not count ``0 .. T - 1``, and a first token dropped
(``prepend_bos=False`` on a tokenizer that adds no BOS, then ``[:, 1:]``). Every analysis here
reads row position ``i`` as absolute position ``i``, so each of these changes the numbers.

:func:`lens_position.core.position_check.check_positions` runs every check and returns a
:class:`~lens_position.core.position_check.PositionReport` (one row per check: ``check``,
``status`` ``"ok"``/``"warning"``/``"error"``/``"not checked"``, the ``rows`` concerned and the
``message``). What is certainly wrong is an error (BadInputError, raised):
position ids that are not ``0 .. T - 1``, tokens that are not the texts' own tokens. What may be
intended (an experiment without BOS, or with two) is a named warning, one class per mistake, so
that a researcher can silence exactly the one they mean (``warnings.simplefilter("ignore",
DoubledBosWarning)``); ``strict=True`` raises on those too.

The input door (:func:`lens_position.core.inputs.checked_prompts`) runs the warning checks before
every analysis: every check on token ids, and on a list of strings those its BOS policy does not
decide (a doubled BOS, BOS inside a row); a PromptSet's position 0 is what its spec says.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import torch
from jaxtyping import Int

from lens_position.ground.caller import outside_stacklevel
from lens_position.models.spec import LoadedModel

__all__ = ["BosInsideWarning", "DoubledBosWarning", "MissingBosWarning", "PaddedStartWarning", "PositionWarning",
           "position_warnings", "warn"]


class PositionWarning(UserWarning):
    """Position 0 or the positions hold something a user may not have meant (module docstring)."""


class DoubledBosWarning(PositionWarning):
    """Rows that start with BOS twice: position 0 and position 1 are both BOS."""


class MissingBosWarning(PositionWarning):
    """Rows without BOS at position 0, for a model whose tokenizer puts one there."""


class BosInsideWarning(PositionWarning):
    """Rows with BOS after position 0 (documents concatenated): a second sink candidate."""


class PaddedStartWarning(PositionWarning):
    """Every row starts with the same run of pad tokens: positions are shifted by the padding."""


def rows_where(mask: torch.Tensor) -> list[int]:
    return mask.nonzero().flatten().tolist()


def listed(rows: list[int]) -> str:
    return f"{rows[:5]}{' ...' if len(rows) > 5 else ''}"


def special_ids(loaded: LoadedModel) -> tuple[int | None, int | None, int | None]:
    """(BOS, EOS, pad) ids of the model's tokenizer (its spec's BOS without one)."""
    tok = loaded.tokenizer
    bos = getattr(tok, "bos_token_id", None) if tok is not None else None
    bos = loaded.spec.bos_token_id if bos is None else bos
    return (bos, getattr(tok, "eos_token_id", None) if tok is not None else None,
            getattr(tok, "pad_token_id", None) if tok is not None else None)


Finding = tuple[str, "type[PositionWarning] | None", list[int], str]


def position_warnings(loaded: LoadedModel, tokens: Int[torch.Tensor, "N T"], *,
                      bos_expected: bool | None = None) -> list[Finding]:
    """The checks that may flag an intended input, on ``tokens``: (check, warning class or None
    when the check passed, rows concerned, message). ``bos_expected``: whether position 0 should be
    BOS (default: where the model's tokenizer prepends one); False skips that check."""
    bos, eos, pad = special_ids(loaded)
    name = loaded.spec.name
    out: list[Finding] = []
    if bos is None:
        return [("bos", None, [], "not checked: the model has no BOS token")]
    at0 = tokens[:, 0] == bos
    doubled = at0 & (tokens[:, 1] == bos) if tokens.shape[1] > 1 else torch.zeros_like(at0)
    rows = rows_where(doubled)
    out.append(("bos_doubled", DoubledBosWarning if rows else None, rows,
                f"rows {listed(rows)} of the prompts start with BOS (id {bos}) twice: a text that already began "
                "with BOS was given BOS again; position 1 is a second BOS, and the sink and position 0's state "
                "are those of a doubled BOS; build the prompts with build_prompts(model, ...) or tokenise with "
                "prepend_bos=False" if rows else ""))
    if bos_expected is None:
        bos_expected = loaded.spec.tokenizer_prepends_bos
    rows = rows_where(~at0) if bos_expected else []
    out.append(("bos_missing", MissingBosWarning if rows else None, rows,
                f"rows {listed(rows)} have no BOS at position 0, but {name}'s tokenizer puts one there (id {bos}): "
                "the model was trained with it, and its sink and position-0 state differ without it; use "
                "build_prompts(model, bos='tokenizer'), or pass bos='none' when leaving it out is the point"
                if rows else ("" if bos_expected else "not checked: this model's tokenizer prepends no BOS")))
    if bos == eos:
        out.append(("bos_inside", None, [], "not checked: BOS is also the end-of-text token, which separates "
                                             "documents inside natural text"))
    else:
        inside = (tokens[:, 2:] == bos).any(1) if tokens.shape[1] > 2 else torch.zeros_like(at0)
        inside |= (tokens[:, 1] == bos) & ~at0 if tokens.shape[1] > 1 else torch.zeros_like(at0)
        rows = rows_where(inside)
        out.append(("bos_inside", BosInsideWarning if rows else None, rows,
                    f"rows {listed(rows)} hold BOS (id {bos}) after position 0 (documents concatenated?): each "
                    "BOS can become a sink of its own; cut the rows at BOS, or build prompts with build_prompts"
                    if rows else ""))
    if pad is not None and pad != bos:
        starts = tokens[:, 0] == pad
        rows = rows_where(starts)
        out.append(("padded_start", PaddedStartWarning if rows else None, rows,
                    f"rows {listed(rows)} start with the pad token (id {pad}): left padding shifts every position "
                    "of the text by the pad run; the analyses have no attention mask and read pads as text; pass "
                    "equal-length prompts (build_prompts(model, text=..., T=...))" if rows else ""))
    return out


def warn(found: list[Finding], *, only: Sequence[str] | None = None) -> None:
    """Issue each flagged finding as its warning class (``only``: these checks alone), pointing at
    the researcher's line that called into lens_position."""
    for check, warning, _, message in found:
        if warning is not None and (only is None or check in only):
            warnings.warn(message, warning, stacklevel=outside_stacklevel())
