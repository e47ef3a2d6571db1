"""A run's provenance without what changes from run to run (timings, the executor), so two runs of the
same configuration can be compared field by field."""

from __future__ import annotations

TIMING = {"wall_s", "cpu_s", "peak_rss_mb", "computed_cost", "load_wall_s", "load_seconds", "created",
          "wall_time_s", "steps_computed_wall_s", "execution"}


def strip_timing(obj):
    """``obj`` (a provenance dict, list or value) with every key of :data:`TIMING` removed, at any depth."""
    if isinstance(obj, dict):
        return {k: strip_timing(v) for k, v in obj.items() if k not in TIMING}
    if isinstance(obj, list):
        return [strip_timing(v) for v in obj]
    return obj
