"""The family matrix: every decoder family the installed transformers has, as a tiny random checkpoint
(:mod:`lens_position.models.family_checkpoints`), through what a researcher does with a model of their
own: ``load_model(folder)`` (the load-time verification included), a decomposition with its exact
identity, sink scores, a one-head K/V patch, the rotary-band split and ``ntk_alpha=4``.

A row's ``status`` is ``works`` (every step ran, or was refused by name where it does not apply),
``refused`` (``load_model`` refused it: ``reason`` says why, in lens_position's words), ``not built``
(transformers cannot build the family from a small config here: not a lens_position matter), or a
defect: ``wrong`` (a step's number off its reference) or ``crash`` (a raw error reached the user).
``python -m lens_position.pipeline.family_matrix`` writes the rows of this TransformerLens line into
``docs/data/family_matrix.json``; the docs' families page and the tests read that file.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import math
import tempfile
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from lens_position.analyses.decompose import check_identity, decompose
from lens_position.analyses.patching import run_patches
from lens_position.analyses.rotary_bands import rotary_bands
from lens_position.analyses.sinks import sink_heads
from lens_position.core.data import build_prompts
from lens_position.core.intervals import Bootstrap
from lens_position.core.patch import Patch
from lens_position.ground.errors import LensPositionError
from lens_position.models import load_model
from lens_position.models.family_checkpoints import write_family_checkpoint

MATRIX_FILE = Path("docs/data/family_matrix.json")
IDENTITY_TOL = 1e-4
_N, _T = 2, 12
_REASONS = (  # the kind of a refusal, from its sentence (first match)
    ("learned sink logit", "learned sink logit"),
    ("number of attention heads", "no attention heads (state-space or recurrent)"),
    ("attends to later keys", "bidirectional (an encoder)"),
    ("does not compute what its Hugging Face source computes", "not exact on this TransformerLens"),
    ("returned attention weights from", "attention weights hidden (linear or hybrid layers)"),
    ("hook_k has shape", "K/V hooks not per query head"),
    ("grouped-query attention", "K/V hooks not per query head"),
    ("softmax(hook_attn_scores) is not hook_pattern", "scores hook not before the softmax"),
    ("TransformerBridge does not support", "no TransformerBridge adapter"),
    ("attention bridge has no", "no scores hook on the bridge"),
    ("TransformerBridge failed on", "TransformerLens error"),
    ("RoPE scaling of type", "RoPE scaling not described"),
    ("already scaled", "RoPE already scaled"),
    ("names custom Python code", "custom code"),
)


@dataclass
class Row:
    """One family's line of the matrix."""

    model_type: str
    status: str
    reason: str = ""
    backend: str = ""
    steps: dict[str, str] = field(default_factory=dict)
    message: str = ""


def reason_of(message: str) -> str:
    """The kind of a refusal, from its sentence (``other`` for one not listed)."""
    return next((kind for needle, kind in _REASONS if needle in message), "other")


def _kv_patch_moves_one_head(loaded: Any, prompts: Any) -> str:
    """``ok`` when a one-head key patch at position 1 of layer 0 moves that head's scores at that key
    only, through the public :class:`Patch` and :func:`run_patches`; else what it moved."""
    reason = loaded.backend.single_head_kv_unsupported("k")
    if reason is not None:
        return "refused by name (" + reason.split(":")[0] + ")"
    head = loaded.spec.n_heads - 1
    value = torch.randn(loaded.spec.d_head, generator=torch.Generator().manual_seed(0)) * 10
    name = "blocks.0.attn.hook_attn_scores"
    scores = run_patches(loaded, prompts, [[], [Patch("blocks.0.attn.hook_k", value, position=1, head=head)]],
                         lambda read: read[name], read=[name], progress=False)
    moved = ((scores[1] - scores[0]).abs() > 1e-6) & torch.isfinite(scores[0])
    heads = moved.any(dim=(0, 2, 3)).nonzero().flatten().tolist()
    keys = moved.any(dim=(0, 1, 2)).nonzero().flatten().tolist()
    return "ok" if heads == [head] and keys == [1] else f"moved heads {heads} keys {keys}"


def _ntk(folder: Path, loaded: Any) -> str:
    if loaded.spec.rotary_base is None:
        return "n/a (no RoPE)"
    try:
        scaled = load_model(str(folder), ntk_alpha=4)
    except LensPositionError as refusal:
        return f"refused: {reason_of(str(refusal))}"
    ratio = _lowest_frequency(loaded) / _lowest_frequency(scaled)
    return "ok" if math.isclose(ratio, 4.0, rel_tol=1e-4) else f"lowest frequency / {ratio:.4g}"


def _lowest_frequency(loaded: Any) -> float:
    """The slowest rotary frequency of layer 0 as the model's attention turns it (the backend's rotary
    tables), else the Hugging Face model's own ``inv_freq`` (a bridge whose rotation hooks do not fire)."""
    try:
        return float(loaded.backend.rotary_layout(0).frequencies.abs().min())
    except LensPositionError:
        original = getattr(loaded.model, "original_model", None)
        tables = [buffer for name, buffer in (original.named_buffers() if original is not None else ())
                  if name.endswith("inv_freq") and not name.rsplit(".", 1)[-1].startswith("original")]
        if not tables:
            raise
        return float(min(float(table.min()) for table in tables))


def run_row(model_type: str, folder: Path, *, steps: bool = True) -> Row:
    """Build ``model_type``'s tiny checkpoint in ``folder`` and run it through the matrix's steps (with
    ``steps=False``, the load and its verification only)."""
    try:
        write_family_checkpoint(model_type, folder)
    except Exception as error:  # transformers' own limits on a small config of this family
        return Row(model_type, "not built", message=f"{type(error).__name__}: {str(error).splitlines()[0][:160]}")
    try:
        loaded = load_model(str(folder))
    except LensPositionError as refusal:
        return Row(model_type, "refused", reason_of(str(refusal)), message=" ".join(str(refusal).split())[:400])
    except Exception as crash:  # a raw error reaching the user: a defect the matrix reports
        return Row(model_type, "crash", message=f"{type(crash).__name__}: {str(crash)[:300]}")
    row = Row(model_type, "works", backend=str(loaded.spec.extra.get("backend")))
    if not steps:
        return row
    prompts = build_prompts(loaded, N=_N, T=_T, source="random")
    done: dict[str, str] = {}
    try:
        decompose(loaded, prompts, bootstrap=Bootstrap(n_resamples=0), progress=False)
        identity_error = float(check_identity(loaded, prompts)["max_abs_error_pattern"].max())
        done["decompose"] = "ok" if identity_error < IDENTITY_TOL else f"identity off by {identity_error:.2g}"
        sink_heads(loaded, prompts, bootstrap=Bootstrap(n_resamples=0), progress=False)
        done["sinks"] = "ok"
        done["kv_patch"] = _kv_patch_moves_one_head(loaded, prompts)
        if loaded.spec.rotary_base is None:
            done["bands"] = "n/a (no RoPE)"
        else:
            try:
                rotary_bands(loaded, prompts, layers=[0], n_bands=2, bootstrap=Bootstrap(n_resamples=0),
                             progress=False)
                done["bands"] = "ok"
            except LensPositionError as refusal:
                done["bands"] = "refused: " + " ".join(str(refusal).split())[:160]
        done["ntk_alpha"] = _ntk(folder, loaded)
    except LensPositionError as refusal:
        done["error"] = " ".join(str(refusal).split())[:200]
    row.steps = done
    bad = [name for name, outcome in done.items()
           if not (outcome == "ok" or outcome.startswith(("n/a", "refused")))]
    if bad:
        row.status = "wrong"
        row.message = "; ".join(f"{name}: {done[name]}" for name in bad)
    return row


def line() -> str:
    """This environment's TransformerLens line: ``"3"`` or ``"4"``."""
    return importlib.metadata.version("transformer_lens").split(".")[0]


def all_model_types() -> list[str]:
    """Every model type transformers maps to a causal language model here."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)


def main(argv: list[str] | None = None) -> int:
    """``python -m lens_position.pipeline.family_matrix [--out FILE] [MODEL_TYPE ...]``: run the rows
    (every family, or the ones named) on this TransformerLens line and write them into ``FILE``."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=MATRIX_FILE)
    parser.add_argument("model_types", nargs="*")
    args = parser.parse_args(argv)
    warnings.simplefilter("ignore")
    data = json.loads(args.out.read_text(encoding="utf-8")) if args.out.exists() else {}
    key = f"transformer_lens {line()}"
    rows = data.setdefault(key, {"versions": {}, "rows": {}})
    rows["versions"] = {name: importlib.metadata.version(name) for name in ("transformer_lens", "transformers")}
    for model_type in args.model_types or all_model_types():
        with tempfile.TemporaryDirectory() as folder:
            row = run_row(model_type, Path(folder) / model_type)
        rows["rows"][model_type] = asdict(row)
        print(json.dumps(asdict(row))[:200], flush=True)
        args.out.parent.mkdir(parents=True, exist_ok=True)  # after every row: a long run keeps what it found
        args.out.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
