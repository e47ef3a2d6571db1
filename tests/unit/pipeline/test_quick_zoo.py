"""What `reproduce --quick` runs of the zoo: two seeds of every variant (a paired comparison
needs two), where the full run takes all three; a zoo checkpoint named explicitly is kept."""

from __future__ import annotations

from lens_position.cli.commands import _config, build_parser
from lens_position.models.zoo.store import checkpoints, parse_name
from lens_position.pipeline.config import QUICK_ZOO_SEEDS
from lens_position.pipeline.models import expand_zoo


def _models(*argv: str) -> tuple[str, ...]:
    argv = ["reproduce", *argv]
    return _config(build_parser().parse_args(argv), argv).models


def test_the_quick_run_takes_two_seeds_of_every_zoo_variant_and_the_full_run_all_of_them():
    variants = {c.variant for c in checkpoints()}
    quick = [m for m in _models("--quick") if m.startswith("zoo:")]
    full = [m for m in _models() if m.startswith("zoo:")]
    assert len(full) == len(checkpoints()) and len(full) > len(quick)
    assert sorted(parse_name(m) for m in quick) == sorted((v, s) for v in variants for s in QUICK_ZOO_SEEDS)
    assert QUICK_ZOO_SEEDS == (0, 1)


def test_seeds_filter_only_the_zoo_request():
    named = ["smollm2-135m", "zoo:rope:seed2", "zoo"]
    expanded = expand_zoo(named, seeds=(0,))
    assert expanded[:2] == ("smollm2-135m", "zoo:rope:seed2")  # named explicitly: kept
    assert all(parse_name(m)[1] == 0 for m in expanded[2:]) and len(expanded) == 2 + len(
        {c.variant for c in checkpoints()})
