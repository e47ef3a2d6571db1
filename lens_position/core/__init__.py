"""The engine: checked inputs, the stream loop, intervals and saved results.

- ``data``: prompt sets (natural text, random and repeated tokens, BOS policies) and corpora;
- ``inputs``: the one input door (``as_prompt_set``) every public analysis calls first;
- ``checks``: the checks of layers, query ranges, counts and seeds, written once;
- ``intervals``: bootstrap and jackknife intervals over whole sequences, three-state verdicts;
- ``results``: ``SavedResult``, tables with provenance that save and load;
- ``stream``: one forward-pass loop that hands each batch's activations to reducers;
- ``patch``: ``Patch``, an intervention as a value (what, where, from which run).
"""
