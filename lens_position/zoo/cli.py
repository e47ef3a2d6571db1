"""``lens-position zoo train`` and ``lens-position zoo list``: argument handling for the zoo."""

from __future__ import annotations

import argparse
from pathlib import Path

from lens_position.zoo.recipe import DEFAULT_SEEDS, VARIANTS


def add_parser(subs: argparse._SubParsersAction) -> None:
    """Add the ``zoo`` sub-command (with ``train`` and ``list``) to the main parser."""
    zoo = subs.add_parser("zoo", help="the controlled model zoo: train variants from their recipes, list them",
                          description="Small byte-level decoders trained under one recipe that varies only "
                                      "the position mechanism (variants: " + ", ".join(VARIANTS) + ").")
    actions = zoo.add_subparsers(dest="zoo_command", metavar="ACTION", parser_class=type(zoo))
    actions.required = True
    train = actions.add_parser("train", help="train variants from their recipes (resumes an interrupted run)",
                               description="Train VARIANT (or 'all') from its recipe, seed-major, and save "
                                           "safetensors + recipe JSON into --root.")
    train.add_argument("variants", nargs="+", metavar="VARIANT", help=f"{', '.join(VARIANTS)}, or all")
    train.add_argument("--seed", dest="seeds", type=int, action="append", default=None,
                       help=f"training seed (repeatable; default {DEFAULT_SEEDS[0]}; "
                            f"'all' trains seeds {', '.join(map(str, DEFAULT_SEEDS))})")
    train.add_argument("--root", type=Path, default=None, help="checkpoint folder (default: the shipped zoo)")
    train.add_argument("--device", default=None, help="cpu or cuda (default: cuda when present)")
    train.add_argument("--retrain", action="store_true", help="retrain even if a checkpoint of the same recipe exists")
    train.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")
    listing = actions.add_parser("list", help="the checkpoints there, with held-out loss and sink rate")
    listing.add_argument("--root", type=Path, default=None, help="checkpoint folder (default: the shipped zoo)")


def run(args: argparse.Namespace) -> str:
    """Do what ``args`` ask; return the text to print."""
    from lens_position.errors import BadInputError
    from lens_position.zoo.commands import list_table, train_variants
    from lens_position.zoo.store import SHIPPED

    root = args.root or SHIPPED
    if args.zoo_command == "list":
        table = list_table(root)
        if table.empty:
            return f"no zoo checkpoints in {root}; train some with `lens-position zoo train all`"
        return table.drop(columns=["recipe_sha256"]).to_string(index=False, float_format=lambda x: f"{x:.3f}")
    variants = list(VARIANTS) if args.variants == ["all"] else args.variants
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        raise BadInputError(f"unknown zoo variant(s) {unknown}; the variants are {', '.join(VARIANTS)}, or all")
    seeds = args.seeds or ([*DEFAULT_SEEDS] if args.variants == ["all"] else [DEFAULT_SEEDS[0]])
    done = train_variants(variants, seeds, root=root, device=args.device, progress=args.progress,
                          skip_existing=not args.retrain)
    return f"{len(done)} zoo checkpoints in {root}: " + ", ".join(c.name for c in done)
