"""The zoo's commands (``lens-position zoo train``, ``list``, ``sink-sweep``): what each does, with
the text it prints; the command line only parses their arguments."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lens_position.analyses.zoo.sweep import SINK_SWEEP
from lens_position.ground.errors import BadInputError
from lens_position.models.zoo.recipe import DEFAULT_SEEDS, VARIANTS

#: the sink sweep's points, cheapest first (``zoo sink-sweep --point``)
SINK_SWEEP_POINTS = tuple(point for point, _, _ in SINK_SWEEP)


def run_zoo(command: str, *, variants: list[str] | None = None, seeds: list[int] | None = None,
            seed: list[int] | None = None, root: Path | None = None, device: str | None = None,
            retrain: bool = False, progress: bool = True, points: list[str] | None = None,
            out: Path | None = None, trajectory_out: Path | None = None, **_: Any) -> str:
    """Run the zoo command ``command`` ("train", "list" or "sink-sweep") and return the text to print."""
    from lens_position.analyses.zoo.training import list_table, train_variants
    from lens_position.models.zoo.store import SHIPPED

    if command == "sink-sweep":
        import pandas as pd

        from lens_position.analyses.zoo.sweep import sink_sweep, sink_trajectory, sweep_markdown, trajectory_sentences

        table = pd.concat([sink_sweep(points, root=root, seed=s, device=device, progress=progress)
                           for s in (seed or [0])], ignore_index=True)
        trajectories = [sink_trajectory(p, root=root, seed=s) for p, s in zip(table["point"], table["seed"])]
        trajectories = [t for t in trajectories if not t.empty]
        sentences = trajectory_sentences(pd.concat(trajectories, ignore_index=True)) if trajectories else []
        text = "\n\n".join([sweep_markdown(table), *sentences])
        if trajectory_out is not None and trajectories:
            trajectory_out.parent.mkdir(parents=True, exist_ok=True)
            pd.concat(trajectories, ignore_index=True).to_csv(trajectory_out, index=False)
        if out is not None:
            out.parent.mkdir(parents=True, exist_ok=True)
            if out.suffix == ".csv":
                table.to_csv(out, index=False)
            else:
                out.write_text(text + "\n")
        return text
    root = root or SHIPPED
    if command == "list":
        listed = list_table(root)
        if listed.empty:
            return f"no zoo checkpoints in {root}; train some with `lens-position zoo train all`"
        return listed.drop(columns=["recipe_sha256"]).to_string(index=False, float_format=lambda x: f"{x:.3f}")
    variants = variants or []
    chosen = list(VARIANTS) if variants == ["all"] else variants
    unknown = [v for v in chosen if v not in VARIANTS]
    if unknown:
        raise BadInputError(f"unknown zoo variant(s) {unknown}; the variants are {', '.join(VARIANTS)}, or all")
    chosen_seeds = seeds or ([*DEFAULT_SEEDS] if variants == ["all"] else [DEFAULT_SEEDS[0]])
    done = train_variants(chosen, chosen_seeds, root=root, device=device, progress=progress,
                          skip_existing=not retrain)
    return f"{len(done)} zoo checkpoints in {root}: " + ", ".join(c.name for c in done)
