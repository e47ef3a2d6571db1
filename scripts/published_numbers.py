"""The published-numbers tables of docs/howto/leakage.md and docs/howto/sink-definitions.md, from a run:
positional leakage and the sink metrics on the embedded models, beside the published numbers.

    .venv/bin/python scripts/published_numbers.py leakage   # the ΔR² table (markdown)
    .venv/bin/python scripts/published_numbers.py sinks     # the sink-definition table (markdown)
"""

import sys

import lens_position as lp
from lens_position.analyses.leakage import published_table
from lens_position.analyses.published import PUBLISHED_SINKS

MODELS = ("smollm2-135m", "gemma3-270m")


def leakage() -> None:
    results = {}
    for name in MODELS:
        model = lp.load_model(name)
        for mode in ("authors", "corrected"):
            results[f"{name} ({mode})"] = lp.positional_leakage(model, mode=mode)
    table = published_table(results)
    print("| model | mode | n | significant heads | top head | its gap [95%] | Jaccard over seeds |")
    print("|---|---|---|---|---|---|---|")
    for row in table.itertuples():
        jaccard = "" if row.jaccard != row.jaccard else f"{row.jaccard:.2f}"
        print(f"| {row.model} | {row.mode} | {row.n_samples} | {row.n_significant} of {row.n_heads} "
              f"({row.share_significant:.0%}) | {row.top_head} | {row.leakage_gap:+.3f} "
              f"[{row.leakage_gap_lo:+.3f}, {row.leakage_gap_hi:+.3f}] | {jaccard} |")


def _value(row) -> str:
    if row.quantity in ("sink_rate", "first_token_mass"):
        return f"{100 * row.value:.1f}% [{100 * row.value_lo:.1f}, {100 * row.value_hi:.1f}]"
    return f"{row.value:.3g} [{row.value_lo:.3g}, {row.value_hi:.3g}]"


def sinks() -> None:
    print("| definition | model | quantity | value [95% over prompts] | inputs |")
    print("|---|---|---|---|---|")
    for measure, model, value, where in PUBLISHED_SINKS:
        print(f"| {measure} | {model} (published) | | {value} | {where} |")
    runs = [("gu", condition) for condition in ("natural", "random", "repeated")]
    runs += [("barbero", "natural"), ("first_token_mass", "natural"), ("eviction", "natural")]
    for name in MODELS:
        model = lp.load_model(name)
        for definition, condition in runs:
            result = lp.sink_metric(model, definition=definition, condition=condition,
                                    N=8 if definition == "eviction" else 16)
            for row in result.frame.itertuples():
                inputs = {"natural": f"first {row.seq_len} tokens of {row.N} documents, with the tokenizer's own BOS",
                          "random": f"{row.N} prompts of {row.seq_len} random tokens after the BOS",
                          "repeated": f"{row.N} prompts of one token repeated {row.seq_len} times, no BOS"}[condition]
                print(f"| {definition} | {name} | {row.quantity} | {_value(row)} | {inputs} |")

if __name__ == "__main__":
    {"leakage": leakage, "sinks": sinks}[sys.argv[1] if len(sys.argv) > 1 else "leakage"]()
