"""``lens-position zoo train``, ``zoo list`` and ``zoo sink-sweep``: argument handling for the zoo."""

from __future__ import annotations

import argparse

from lens_position.cli.argtypes import path_option, seed_option
from lens_position.models.zoo.recipe import DEFAULT_SEEDS, VARIANTS
from lens_position.pipeline.zoo import SINK_SWEEP_POINTS


def add_parser(subs: argparse._SubParsersAction) -> None:
    """Add the ``zoo`` sub-command (with ``train``, ``list`` and ``sink-sweep``) to the main parser."""
    zoo = subs.add_parser("zoo", help="the controlled model zoo: train variants from their recipes, list them",
                          description="Small byte-level decoders trained under one recipe that varies only "
                                      "the position mechanism (variants: " + ", ".join(VARIANTS) + ").")
    actions = zoo.add_subparsers(dest="zoo_command", metavar="ACTION", parser_class=type(zoo))
    actions.required = True
    train = actions.add_parser("train", help="train variants from their recipes (resumes an interrupted run)",
                               description="Train VARIANT (or 'all') from its recipe, seed-major, and save "
                                           "safetensors + recipe JSON into --root.")
    train.add_argument("variants", nargs="+", metavar="VARIANT", help=f"{', '.join(VARIANTS)}, or all")
    train.add_argument("--seed", dest="seeds", type=seed_option, action="append", default=None,
                       help=f"training seed (repeatable; default {DEFAULT_SEEDS[0]}; "
                            f"'all' trains seeds {', '.join(map(str, DEFAULT_SEEDS))})")
    train.add_argument("--root", type=path_option, default=None, help="checkpoint folder (default: the shipped zoo)")
    train.add_argument("--device", default=None, help="cpu or cuda (default: cuda when present)")
    train.add_argument("--retrain", action="store_true", help="retrain even if a checkpoint of the same recipe exists")
    train.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")
    listing = actions.add_parser("list", help="the checkpoints there, with held-out loss and sink rate")
    listing.add_argument("--root", type=path_option, default=None, help="checkpoint folder (default: the shipped zoo)")
    sweep = actions.add_parser(
        "sink-sweep", help="at what training budget do attention sinks form? (rope recipe, more steps/context/width)",
        description="Train the standard-RoPE recipe at larger budgets (more steps, a longer context, a wider "
                    "model; points: " + ", ".join(SINK_SWEEP_POINTS) + ") and measure each model's "
                    "sink rate (Gu et al., eps = 0.3) and largest head sink score. Points already trained in "
                    "--root are read, not retrained.")
    sweep.add_argument("--point", dest="points", action="append", default=None, metavar="POINT",
                       help="sweep point (repeatable; default: every point, cheapest first)")
    sweep.add_argument("--root", type=path_option, default=None,
                       help="checkpoint folder of the sweep (default: $LENS_POSITION_CACHE/zoo/sink-sweep)")
    sweep.add_argument("--seed", type=seed_option, nargs="+", default=[0],
                       help="training seed, or several (each point is trained once per seed; default 0)")
    sweep.add_argument("--device", default=None, help="cpu or cuda (default: cuda when present)")
    sweep.add_argument("--out", type=path_option, default=None, help="also write the table here (.csv or .md)")
    sweep.add_argument("--trajectory-out", type=path_option, default=None,
                       help="also write the sink scores measured along the long points' training here (.csv)")
    sweep.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")


def run(args: argparse.Namespace) -> str:
    """Do what ``args`` ask (:func:`lens_position.pipeline.zoo.run_zoo`); return the text to print."""
    from lens_position.pipeline.zoo import run_zoo

    return run_zoo(args.zoo_command, **{k: v for k, v in vars(args).items()
                                        if k in ("variants", "seeds", "seed", "root", "device", "retrain", "progress",
                                                 "points", "out", "trajectory_out")})
