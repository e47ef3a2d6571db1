"""``check_positions``: every position-hygiene check on a model's prompts, as a report
(:mod:`lens_position.core.positions` says what each check is and why)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd
import torch

from lens_position.core.inputs import checked_prompts
from lens_position.core.positions import listed, position_warnings, rows_where, special_ids, warn
from lens_position.ground.errors import BadInputError
from lens_position.models.spec import LoadedModel, public

__all__ = ["REPORT_COLUMNS", "PositionReport", "check_positions"]

REPORT_COLUMNS = ["check", "status", "rows", "message"]


@dataclass
class PositionReport:
    """What :func:`check_positions` found: ``frame`` has one row per check (module docstring)."""

    frame: pd.DataFrame

    @property
    def ok(self) -> bool:
        """No warning and no error."""
        return not self.frame["status"].isin(["warning", "error"]).any()

    def __repr__(self) -> str:
        lines = [f"{row.check}: " + (row.message if row.message.startswith(row.status) else
                                      row.status + (f" ({row.message})" if row.message else ""))
                 for row in self.frame.itertuples()]
        return "PositionReport\n  " + "\n  ".join(lines)


def _check_position_ids(position_ids: Any, shape: tuple[int, int]) -> str:
    """"" when ``position_ids`` count ``0 .. T - 1`` in every row (or are None), else the error."""
    if position_ids is None:
        return ""
    try:
        ids = torch.as_tensor(position_ids)
    except (TypeError, ValueError, RuntimeError):
        return (f"position_ids must be whole numbers, one per position (a tensor, an array or a list), got "
                f"{type(position_ids).__name__} {str(position_ids)[:40]!r}")
    if ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool:
        return f"position_ids must be whole numbers, got a tensor of {str(ids.dtype).removeprefix('torch.')}"
    if ids.ndim == 1:
        ids = ids[None].expand(shape[0], -1)
    expected = torch.arange(shape[1]).expand(shape[0], -1)
    if tuple(ids.shape) != shape:
        return f"position_ids have shape {tuple(ids.shape)} but the tokens {shape}"
    rows = rows_where((ids.to(torch.int64) != expected).any(1))
    if not rows:
        return ""
    first = ids[rows[0]].tolist()[:6]
    return (f"position_ids of rows {listed(rows)} do not count 0 .. T - 1 (row {rows[0]} starts {first}): the "
            "analyses run every row at positions 0 .. T - 1, so these ids (left padding, a shifted window) "
            "would be ignored and every position read wrong; pass rows whose positions start at 0")


def _check_texts(loaded: LoadedModel, tokens: torch.Tensor, texts: Sequence[str], bos: int | None) -> str:
    """"" when each row, after a leading BOS, is the start of its text's own tokens, else the error."""
    if loaded.tokenizer is None:
        return ""
    if len(texts) != len(tokens):
        return f"{len(texts)} texts for {len(tokens)} rows of tokens"
    bad = []
    for r, text in enumerate(texts):
        row = tokens[r].tolist()
        if bos is not None and row and row[0] == bos:
            row = row[1:]
        own = loaded.tokenizer(text, add_special_tokens=False)["input_ids"]
        if row != own[:len(row)]:
            bad.append(r)
    if not bad:
        return ""
    r = bad[0]
    own = loaded.tokenizer(texts[r], add_special_tokens=False)["input_ids"][:4]
    return (f"rows {listed(bad)} are not the start of their texts' tokens (row {r} begins "
            f"{tokens[r, :4].tolist()}, its text's tokens begin {own}): a token was dropped or added at the start "
            "(prepend_bos=False then [:, 1:] drops the first word); tokenise the texts again, or pass the texts "
            "themselves")


@public
def check_positions(loaded: LoadedModel, prompts: Any, *, texts: Sequence[str] | None = None,
                    position_ids: Any = None, bos_expected: bool | None = None, strict: bool = False
                    ) -> PositionReport:
    """Check that every position of ``prompts`` is what the analyses will take it to be (module
    docstring): BOS once at position 0 where the model expects it, not doubled, not inside a row;
    no left padding; ``position_ids`` (or the mapping's ``"position_ids"``) counting ``0 .. T - 1``;
    with ``texts``, each row the start of its text's own tokens (nothing dropped).

    Errors (BadInputError) are raised; warnings are issued with their class (:class:`PositionWarning`
    subclasses), or raised as a BadInputError naming them all with ``strict=True``. Returns the
    report of every check."""
    if isinstance(prompts, dict) and position_ids is None:
        position_ids = prompts.get("position_ids")
        prompts = {k: v for k, v in prompts.items() if k != "position_ids"}
    tokens = checked_prompts(loaded, prompts, hygiene=False).tokens
    found = position_warnings(loaded, tokens, bos_expected=bos_expected)
    rows = []
    for check, warning, which, message in found:
        status = "warning" if warning is not None else ("not checked" if message.startswith("not checked") else "ok")
        rows.append({"check": check, "status": status, "rows": which, "message": message})
    errors = {"position_ids": _check_position_ids(position_ids, tuple(tokens.shape)),
              "texts": "" if texts is None else _check_texts(loaded, tokens, texts, special_ids(loaded)[0])}
    for check, message in errors.items():
        rows.append({"check": check, "status": "error" if message else ("ok" if check == "position_ids" or texts
                                                                        else "not checked"),
                     "rows": [], "message": message or ("" if texts is not None or check == "position_ids"
                                                        else "not checked: no texts given")})
    report = PositionReport(pd.DataFrame(rows, columns=REPORT_COLUMNS))
    failed = [m for m in errors.values() if m]
    flagged = [(row["check"], row["message"]) for row in rows if row["status"] == "warning"]
    if failed or (strict and flagged):
        raise BadInputError("; ".join(failed + [f"{check}: {message}" for check, message in flagged]))
    warn(found)
    return report


