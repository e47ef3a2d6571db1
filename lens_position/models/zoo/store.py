"""Zoo checkpoints on disk, and loading them as ``LoadedModel``s.

A checkpoint is two files in ``<root>/<variant>/``: ``seed<k>.safetensors`` (the
parameters, fp32, with the recipe hash in the safetensors metadata) and ``seed<k>.json``
(the recipe, its sha256, the corpus, what training measured: held-out loss, unigram
baseline, loss curve, seconds, tokens per second, machine load; and the sink rate, added
by :func:`lens_position.analyses.zoo.measure.measure_sinks`). The shipped zoo lives in the package
(``lens_position/models/zoo/checkpoints``) and loads offline.

Names: ``zoo:<variant>`` is seed 0, ``zoo:<variant>:seed<k>`` seed ``k``; ``zoo`` alone (in
``--models``) means every shipped checkpoint.
"""

from __future__ import annotations

import difflib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformer_lens import HookedTransformer

import hashlib
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from safetensors.torch import load_file, save_file

from lens_position.ground.errors import BadInputError, CorruptFileError, UnknownModelError
from lens_position.ground.files import read_json
from lens_position.models.backends import resolve_backend
from lens_position.models.spec import LoadedModel, attach_tokenizer, spec_from_config, tokenizer_prepends_bos
from lens_position.models.tiny import byte_tokenizer
from lens_position.models.zoo.architecture import build_model, load_parameters
from lens_position.models.zoo.recipe import VARIANTS, Recipe, recipe_for

SHIPPED = Path(__file__).parent / "checkpoints"
_NAME = re.compile(r"^zoo:(?P<variant>[a-z0-9.-]+)(?::seed(?P<seed>\d+))?$")


@dataclass(frozen=True)
class Checkpoint:
    """Where one checkpoint is and what its JSON says."""

    variant: str
    seed: int
    weights: Path
    meta: dict[str, Any]

    @property
    def name(self) -> str:
        return model_name(self.variant, self.seed)

    @property
    def recipe(self) -> Recipe:
        return Recipe.from_dict(self.meta["recipe"])


def model_name(variant: str, seed: int) -> str:
    """The ``load_model`` name of a zoo checkpoint."""
    return f"zoo:{variant}" if seed == 0 else f"zoo:{variant}:seed{seed}"


def parse_name(name: str) -> tuple[str, int]:
    """``"zoo:rope:seed2"`` -> ``("rope", 2)`` (BadInputError on a malformed name)."""
    match = _NAME.match(name)
    if not match:
        raise BadInputError(f"{name!r} is not a zoo name; use zoo:<variant> or zoo:<variant>:seed<k> "
                            f"(variants: {', '.join(VARIANTS)})")
    return match["variant"], int(match["seed"] or 0)


def paths(root: Path, variant: str, seed: int) -> tuple[Path, Path]:
    """``(weights, JSON)`` paths of a checkpoint under ``root``."""
    return root / variant / f"seed{seed}.safetensors", root / variant / f"seed{seed}.json"


def save_checkpoint(root: Path, result: Any, corpus: Any, unigram_bits: float) -> Checkpoint:
    """Write a finished ``TrainResult`` (weights first, then the JSON that names them, each
    atomically, so a JSON never points at missing weights)."""
    recipe = result.recipe
    weights, meta_path = paths(root, recipe.variant, recipe.seed)
    weights.parent.mkdir(parents=True, exist_ok=True)
    digest = recipe.sha256()
    partial = weights.with_suffix(f".{os.getpid()}.tmp")
    save_file(result.parameters, str(partial), metadata={"recipe_sha256": digest})
    partial.replace(weights)
    meta = {
        "name": model_name(recipe.variant, recipe.seed), "recipe": recipe.to_dict(), "recipe_sha256": digest,
        "weights_sha256": hashlib.sha256(weights.read_bytes()).hexdigest(),
        "n_parameters": int(sum(p.numel() for p in result.parameters.values())),
        "corpus": corpus.describe(), "corpus_sha256": corpus.sha256,
        "tokens": recipe.tokens, "held_out_bits_per_byte": result.held_out_bits,
        "unigram_bits_per_byte": unigram_bits, "curve": result.curve, "train_seconds": result.seconds,
        "tokens_per_second": result.tokens_per_second, "device": result.device,
        "resumed_from_step": result.resumed_from, "environment": result.environment,
    }
    _write_json(meta_path, meta)
    return Checkpoint(recipe.variant, recipe.seed, weights, meta)


def _write_json(path: Path, meta: dict[str, Any]) -> None:
    partial = path.with_suffix(f".{os.getpid()}.tmp")
    partial.write_text(json.dumps(meta, indent=1, sort_keys=True) + "\n")
    partial.replace(path)


def update_meta(checkpoint: Checkpoint, **fields: Any) -> Checkpoint:
    """Add measurement fields to a checkpoint's JSON (never its recipe or hashes)."""
    protected = {"recipe", "recipe_sha256", "weights_sha256"} & set(fields)
    if protected:
        raise ValueError(f"{sorted(protected)} describe the weights and cannot be updated")
    meta = {**checkpoint.meta, **fields}
    _write_json(paths(checkpoint.weights.parents[1], checkpoint.variant, checkpoint.seed)[1], meta)
    return Checkpoint(checkpoint.variant, checkpoint.seed, checkpoint.weights, meta)


def checkpoints(root: Path = SHIPPED) -> list[Checkpoint]:
    """Every checkpoint under ``root``, in variant order (``VARIANTS``) then seed."""
    found = []
    for meta_path in sorted(root.glob("*/seed*.json")):
        seed = int(meta_path.stem.removeprefix("seed"))
        variant = meta_path.parent.name
        weights = meta_path.with_suffix(".safetensors")
        found.append(Checkpoint(variant, seed, weights, _read_meta(meta_path)))
    order = {v: i for i, v in enumerate(VARIANTS)}
    return sorted(found, key=lambda c: (order.get(c.variant, len(order)), c.variant, c.seed))


def find(name: str, root: Path = SHIPPED) -> Checkpoint:
    """The checkpoint called ``name`` (UnknownModelError listing what is there)."""
    variant, seed = parse_name(name)
    weights, meta_path = paths(root, variant, seed)
    if not meta_path.is_file() or not weights.is_file():
        names = [c.name for c in checkpoints(root)]
        near = difflib.get_close_matches(name, names, n=1, cutoff=0.75)
        guess = f"did you mean {near[0]!r}? " if near else ""
        raise UnknownModelError(
            f"no zoo checkpoint {name!r} in {root}; {guess}there: {', '.join(names) or 'none'}; or train it with "
            f"`lens-position zoo train {variant} --seed {seed}`")
    return Checkpoint(variant, seed, weights, _read_meta(meta_path))


_META_KEYS = ("recipe", "recipe_sha256", "weights_sha256")


def _read_meta(meta_path: Path) -> dict[str, Any]:
    """A checkpoint's JSON (CorruptFileError naming it when it is not a checkpoint's record)."""
    meta = read_json(meta_path, "zoo checkpoint record")
    if not isinstance(meta, dict) or any(key not in meta for key in _META_KEYS):
        raise CorruptFileError(f"{meta_path} is not a zoo checkpoint record (it needs {', '.join(_META_KEYS)}); "
                               f"restore it, or retrain the checkpoint (`lens-position zoo train "
                               f"{meta_path.parent.name} --retrain`)")
    return meta


def verify(checkpoint: Checkpoint) -> Recipe:
    """Check that a checkpoint is what its recipe says: the JSON's recipe hashes to the
    recorded hash, the safetensors metadata names the same hash, the weights' sha256 is the
    recorded one, and the recipe is the current code's recipe for that variant and seed.
    Returns the recipe; raises CorruptFileError otherwise."""
    try:
        recipe = checkpoint.recipe
    except (KeyError, TypeError, ValueError) as error:
        raise CorruptFileError(f"{checkpoint.name}: the recipe in its JSON cannot be read ({error}); restore "
                               f"it, or retrain it (`lens-position zoo train {checkpoint.variant} --seed "
                               f"{checkpoint.seed} --retrain`)") from error
    digest = recipe.sha256()
    if digest != checkpoint.meta["recipe_sha256"]:
        raise CorruptFileError(f"{checkpoint.name}: its JSON's recipe hashes to {digest[:12]}, "
                               f"not the recorded {checkpoint.meta['recipe_sha256'][:12]}")
    from safetensors import safe_open

    try:
        with safe_open(str(checkpoint.weights), framework="pt") as handle:
            stored = (handle.metadata() or {}).get("recipe_sha256")
    except Exception as error:  # safetensors raises its own types for a truncated or damaged file
        raise CorruptFileError(f"{checkpoint.weights} cannot be read ({type(error).__name__}: {error}); it is "
                               f"truncated or damaged: restore it, or retrain it (`lens-position zoo train "
                               f"{checkpoint.variant} --seed {checkpoint.seed} --retrain`)") from error
    if stored != digest:
        raise CorruptFileError(f"{checkpoint.weights} was made by recipe {str(stored)[:12]}, its JSON "
                               f"says {digest[:12]}")
    if hashlib.sha256(checkpoint.weights.read_bytes()).hexdigest() != checkpoint.meta["weights_sha256"]:
        raise CorruptFileError(f"{checkpoint.weights} does not match the sha256 recorded in its JSON")
    if checkpoint.variant in VARIANTS and recipe != recipe_for(checkpoint.variant, checkpoint.seed):
        raise CorruptFileError(
            f"{checkpoint.name} was trained with a recipe that differs from the current code's "
            f"recipe for {checkpoint.variant!r}; retrain it with `lens-position zoo train "
            f"{checkpoint.variant} --seed {checkpoint.seed}`")
    return recipe


def load_zoo_model(name: str, *, root: Path = SHIPPED, device: str = "cpu",
                   backend: str = "auto") -> LoadedModel:
    """A zoo checkpoint as a ``LoadedModel`` (verified first; see :func:`verify`).

    ``backend="hooked"``: the ``HookedTransformer`` it was trained as (TransformerLens 3.x);
    ``"bridge"``: the same weights in a Hugging Face model booted into a ``TransformerBridge``
    (:mod:`lens_position.models.zoo.hf`; every variant but ``learned``, TransformerLens 3.9 and 4.x);
    ``"auto"``: hooked where TransformerLens has it, else the bridge, and for ``learned`` (no Hugging
    Face family has learned absolute positions) a ``MiniTransformer``, which computes what the
    ``HookedTransformer`` computes (:mod:`lens_position.models.mini`).
    The tokenizer is byte-level; for a variant trained with BOS it prepends ``<bos>``
    (id 1), as Gemma-3's does, so the analyses' ``bos="tokenizer"`` matches training.
    """
    chosen = resolve_backend(backend)
    checkpoint = find(name, root)
    recipe = verify(checkpoint)
    if chosen == "bridge" and (backend == "bridge" or recipe.position != "learned"):
        from lens_position.models.zoo.hf import load_zoo_bridge

        return load_zoo_bridge(checkpoint, recipe, source=f"zoo:{root / recipe.variant}", device=device)
    model = build_model(recipe, device=device, initialise=False)
    load_parameters(model, {k: v.to(device) for k, v in load_file(str(checkpoint.weights)).items()})
    return as_loaded_model(model, recipe, name=checkpoint.name, source=f"zoo:{root / recipe.variant}",
                           weights_sha256=checkpoint.meta["weights_sha256"],
                           held_out_bits=checkpoint.meta["held_out_bits_per_byte"],
                           recipe_sha256=checkpoint.meta["recipe_sha256"])


def as_loaded_model(model: HookedTransformer, recipe: Recipe, *, name: str, source: str,
                    weights_sha256: str | None = None, held_out_bits: float | None = None,
                    recipe_sha256: str | None = None) -> LoadedModel:
    """A zoo-architecture model (a checkpoint's, or one still training) as a ``LoadedModel``
    in eval mode, with the byte-level tokenizer and BOS policy of ``recipe``."""
    model.eval()
    model.cfg.model_name = name
    tokenizer = byte_tokenizer(prepend_bos=recipe.bos)
    prepends_bos = tokenizer_prepends_bos(tokenizer)  # the recipe's bos, as the tokenizer does it
    attach_tokenizer(model, tokenizer, prepends_bos)
    # The one spec builder reads the layers, window, heads and context off the built model; the
    # recipe adds what the config cannot tell: how the final base was reached (NTK-aware).
    ntk = recipe.position == "rope" and recipe.ntk_alpha != 1.0
    spec = spec_from_config(
        model, name=name, family="custom", source=source,
        **({"rope_kind": "ntk-aware", "ntk_alpha": recipe.ntk_alpha} if ntk else {}),
        tokenizer_prepends_bos=prepends_bos, bos_token_id=tokenizer.bos_token_id,
        weights_sha256=weights_sha256,
        extra={"zoo_variant": recipe.variant, "zoo_seed": recipe.seed, "position": recipe.position,
               "recipe_sha256": recipe_sha256 or recipe.sha256(), "extend_at": recipe.extend_at,
               "pretrain_rotary_base": recipe.rotary_base,
               "held_out_bits_per_byte": held_out_bits,
               "d_vocab": model.cfg.d_vocab, "backend": "hooked"},
    )
    return LoadedModel(model=model, tokenizer=tokenizer, spec=spec)
