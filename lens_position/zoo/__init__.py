"""The controlled zoo: small decoders trained under one recipe that varies only the position
mechanism, shipped as checkpoints and loaded like any other model.

- ``recipe``: one frozen dataclass per variant (``VARIANTS``), hashed into each checkpoint;
- ``corpus``: the training text (CPython's standard-library docstrings and comments, bytes);
- ``architecture``: a recipe as a TransformerLens ``HookedTransformer``;
- ``train``: resumable, bit-reproducible training (CPU by default, a GPU when present);
- ``store``: checkpoints on disk, ``load_model("zoo:<variant>[:seed<k>]")``;
- ``measure``: the sink rate stored beside each checkpoint;
- ``c3``: C3 answered from the zoo with paired per-seed differences;
- ``commands``/``cli``: ``lens-position zoo train`` and ``lens-position zoo list``.
"""
