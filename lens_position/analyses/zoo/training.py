"""The zoo's training runs as functions: train, save and measure each variant (``lens-position zoo
train``), and the table of shipped checkpoints (``lens-position zoo list``)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from lens_position.models.zoo.corpus import training_split, unigram_bits_per_byte
from lens_position.models.zoo.recipe import recipe_for
from lens_position.models.zoo.store import SHIPPED, Checkpoint, checkpoints, save_checkpoint
from lens_position.models.zoo.train import train

log = logging.getLogger(__name__)


def default_work_dir() -> Path:
    """Where resume checkpoints go (``$LENS_POSITION_CACHE/zoo/work``)."""
    from lens_position.models.cache import default_cache_dir

    return default_cache_dir() / "zoo" / "work"


def train_variants(variants: Sequence[str], seeds: Sequence[int], *, root: Path = SHIPPED,
                   work_dir: Path | None = None, device: str | None = None, progress: bool = True,
                   skip_existing: bool = True, measure: bool = True) -> list[Checkpoint]:
    """Train every ``(seed, variant)`` pair, seed-major (all variants of seed 0 first, so an
    interrupted zoo has every variant with as many seeds as finished), save each into
    ``root`` and, with ``measure``, add its sink rate. A checkpoint already in ``root`` with
    the same recipe hash is kept (``skip_existing``)."""
    from lens_position.analyses.zoo.measure import measure_sinks

    corpus = training_split()
    unigram = unigram_bits_per_byte(corpus)
    existing = {c.name: c for c in checkpoints(root)}
    done = []
    for seed in seeds:
        for variant in variants:
            recipe = recipe_for(variant, seed)
            from lens_position.models.zoo.store import model_name

            old = existing.get(model_name(variant, seed))
            if skip_existing and old is not None and old.meta["recipe_sha256"] == recipe.sha256():
                log.info("%s already trained with this recipe; kept", old.name)
                done.append(old)
                continue
            result = train(recipe, work_dir=work_dir or default_work_dir(), device=device,
                           progress=progress, corpus=corpus)
            checkpoint = save_checkpoint(root, result, corpus, unigram)
            if measure:
                checkpoint = measure_sinks(checkpoint, root=root)
            print(f"{checkpoint.name}: held-out {result.held_out_bits:.3f} bits/byte (unigram "
                  f"{unigram:.3f}), {result.seconds:.0f} s, {result.tokens_per_second:.0f} tokens/s, "
                  f"load {result.environment.get('load_average')}", flush=True)
            done.append(checkpoint)
    return done


def list_table(root: Path = SHIPPED) -> pd.DataFrame:
    """One row per checkpoint: name, variant, seed, parameters, tokens, held-out and unigram
    bits per byte, training seconds and tokens/s, sink rate (Gu et al., ε = 0.3) with BOS."""
    rows = []
    for c in checkpoints(root):
        sinks = c.meta.get("sinks") or {}
        rows.append({
            "name": c.name, "variant": c.variant, "seed": c.seed, "parameters": c.meta["n_parameters"],
            "tokens": c.meta["tokens"], "held_out_bits": c.meta["held_out_bits_per_byte"],
            "unigram_bits": c.meta["unigram_bits_per_byte"], "train_seconds": c.meta["train_seconds"],
            "tokens_per_second": c.meta["tokens_per_second"], "sink_rate": sinks.get("sink_rate"),
            "max_sink_score": sinks.get("max_sink_score"), "recipe_sha256": c.meta["recipe_sha256"][:12],
        })
    return pd.DataFrame(rows)
