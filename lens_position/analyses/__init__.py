"""The analyses: each takes a model and prompts and returns a result with tables.

- ``decompose``: the exact mask/residual decomposition of attention (both splits, held-out);
- ``probes``: ridge position probes on the residual stream;
- ``patching``: activation patching and ablation, sweeps, TransformerLens-compatible entry points;
- ``compare``: paired differences between a base result and conditions;
- ``bos``: BOS replacement (C4); ``sinks``: sink and sink-reading heads;
- ``fingerprint``: the position-0 fingerprint (C5); ``trajectory``: position-0 trajectory patching;
- ``prompt_sets``: the claims' numbers on independent prompt sets;
- ``tables``: the registry of the tables a reproduction writes (read by the steps, the report, the takeaways);
- ``zoo``: the controlled zoo's measurements (sink rate, the sink sweep).
"""
