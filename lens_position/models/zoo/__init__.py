"""The controlled zoo as a model source: small decoders trained under one recipe that varies
only the position mechanism, shipped as checkpoints and loaded like any other model.

- ``recipe``: one frozen dataclass per variant (``VARIANTS``), hashed into each checkpoint;
- ``corpus``: the training text (CPython's standard-library docstrings and comments, bytes);
- ``architecture``: a recipe as a TransformerLens ``HookedTransformer``;
- ``train``: resumable, bit-reproducible training (CPU by default, a GPU when present);
- ``store``: checkpoints on disk, ``load_model("zoo:<variant>[:seed<k>]")``.

Measurements on the zoo live in ``lens_position.analyses.zoo``, its report section in
``lens_position.report.zoo`` and its commands in ``lens_position.cli.zoo``.
"""
