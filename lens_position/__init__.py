"""lens_position: where absolute position comes from in decoder-only transformers.

The package is layered; each folder imports only from the folders below it (a contract the
test suite checks with import-linter):

- ``cli``: the ``lens-position`` command line;
- ``pipeline``: the reproduction (steps as values, plan -> execute -> write -> report);
- ``report``: takeaways, figures and the HTML report (reads tables, never runs an analysis);
- ``analyses``: decomposition, probes, patching, BOS replacement, sinks, fingerprints, claims;
- ``core``: prompt sets and the input door, checks, intervals, results, the stream loop, ``Patch``;
- ``models``: loading, adapters, the tiny and hand-set models, the controlled zoo as a model source;
- ``ground``: errors, progress bars, provenance.

The names most used are importable from here (``from lens_position import load_model,
decompose``); each is imported on first use, so ``import lens_position`` stays cheap (the
command line's parser must not pull in TransformerLens).
"""

import importlib
from typing import TYPE_CHECKING, Any

from lens_position.ground.version import __version__

if TYPE_CHECKING:  # what the lazy names are, for type checkers and the API reference
    from lens_position.analyses.analyze import Analysis, analyze
    from lens_position.analyses.bos import bos_replacement
    from lens_position.analyses.compare import compare
    from lens_position.analyses.decompose import Decomposition, decompose, decompose_dense
    from lens_position.analyses.fingerprint import fingerprint
    from lens_position.analyses.leakage import PositionalLeakage, leakage_texts, positional_leakage
    from lens_position.analyses.length_sweep import LengthSweep, length_sweep
    from lens_position.analyses.massive import (
        MassiveActivations,
        MassiveIntervention,
        massive_activations,
        massive_intervention,
    )
    from lens_position.analyses.patching import resid_pre_sweep, run_patches
    from lens_position.analyses.probes import position_probe
    from lens_position.analyses.rollout import AttentionRollout, attention_rollout
    from lens_position.analyses.sink_definitions import SinkMetric, sink_metric
    from lens_position.analyses.sink_origin import SinkOrigin, sink_origin
    from lens_position.analyses.sinks import sink_heads, sink_rate, sink_reading_heads
    from lens_position.core.data import build_prompts
    from lens_position.core.inputs import check_prompts
    from lens_position.core.patch import Patch
    from lens_position.core.position_check import PositionReport, check_positions
    from lens_position.core.positions import (
        BosInsideWarning,
        DoubledBosWarning,
        MissingBosWarning,
        PaddedStartWarning,
        PositionWarning,
    )
    from lens_position.ground.errors import (
        BadInputError,
        ContextLengthError,
        CorruptFileError,
        LensPositionError,
        MissingPackageError,
        ResourceError,
        UnknownModelError,
        UnsupportedArchitectureError,
    )
    from lens_position.models import describe, load_model
    from lens_position.models.spec import as_loaded

_EXPORTS = {
    **dict.fromkeys(["load_model", "describe"], "lens_position.models"),
    **dict.fromkeys(["as_loaded"], "lens_position.models.spec"),
    **dict.fromkeys(["build_prompts"], "lens_position.core.data"),
    **dict.fromkeys(["check_prompts"], "lens_position.core.inputs"),
    **dict.fromkeys(["Patch"], "lens_position.core.patch"),
    **dict.fromkeys(["PositionReport", "check_positions"], "lens_position.core.position_check"),
    **dict.fromkeys(["BosInsideWarning", "DoubledBosWarning", "MissingBosWarning", "PaddedStartWarning",
                     "PositionWarning"], "lens_position.core.positions"),
    **dict.fromkeys(["Analysis", "analyze"], "lens_position.analyses.analyze"),
    **dict.fromkeys(["Decomposition", "decompose", "decompose_dense"], "lens_position.analyses.decompose"),
    **dict.fromkeys(["position_probe"], "lens_position.analyses.probes"),
    **dict.fromkeys(["AttentionRollout", "attention_rollout"], "lens_position.analyses.rollout"),
    **dict.fromkeys(["PositionalLeakage", "leakage_texts", "positional_leakage"], "lens_position.analyses.leakage"),
    **dict.fromkeys(["SinkMetric", "sink_metric"], "lens_position.analyses.sink_definitions"),
    **dict.fromkeys(["LengthSweep", "length_sweep"], "lens_position.analyses.length_sweep"),
    **dict.fromkeys(["MassiveActivations", "MassiveIntervention", "massive_activations", "massive_intervention"],
                    "lens_position.analyses.massive"),
    **dict.fromkeys(["SinkOrigin", "sink_origin"], "lens_position.analyses.sink_origin"),
    **dict.fromkeys(["resid_pre_sweep", "run_patches"], "lens_position.analyses.patching"),
    **dict.fromkeys(["compare"], "lens_position.analyses.compare"),
    **dict.fromkeys(["bos_replacement"], "lens_position.analyses.bos"),
    **dict.fromkeys(["sink_heads", "sink_rate", "sink_reading_heads"], "lens_position.analyses.sinks"),
    **dict.fromkeys(["fingerprint"], "lens_position.analyses.fingerprint"),
    **dict.fromkeys(["BadInputError", "ContextLengthError", "CorruptFileError", "LensPositionError",
                     "MissingPackageError", "ResourceError", "UnknownModelError", "UnsupportedArchitectureError"],
                    "lens_position.ground.errors"),
}
__all__ = ["__version__", *sorted(_EXPORTS)]


def __getattr__(name: str) -> Any:
    """Import a public name's module on first use."""
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})
