"""The published-numbers tables of docs/howto/leakage.md and docs/howto/sink-definitions.md, from a run:
positional leakage and the sink metrics on the embedded models, beside the published numbers.

    .venv/bin/python scripts/published_numbers.py leakage   # the ΔR² table (markdown)
    .venv/bin/python scripts/published_numbers.py sinks     # the sink-definition table (markdown)
"""

import sys

import lens_position as lp
from lens_position.analyses.leakage import published_table

MODELS = ("smollm2-135m", "gemma3-270m")
#: published values: (measure, model, value, where)
PUBLISHED_SINKS = (
    ("gu", "Mistral-7B", "97.49%", "Gu et al. 2025, natural text, T = 64"),
    ("gu", "LLaMA2-7B", "92.47%", "Gu et al. 2025, natural text, T = 64"),
    ("gu", "LLaMA3-8B", "99.02%", "Gu et al. 2025, natural text, T = 64"),
    ("eviction", "Llama-2-13B", "window 0+1024: 5158.07; 4 sinks + 1020: 5.40",
     "Xiao et al. 2024 (StreamingLLM), Table 1, perplexity on PG19"),
)


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
    for definition, model, value, where in PUBLISHED_SINKS:
        print(f"| {definition} | {model} (published) | | {value} | {where} |")
    for name in MODELS:
        model = lp.load_model(name)
        for definition in ("gu", "barbero", "first_token_mass", "eviction"):
            result = lp.sink_metric(model, definition=definition, N=8 if definition == "eviction" else 16)
            for row in result.frame.itertuples():
                inputs = f"first {row.seq_len} tokens of {row.N} documents, with the tokenizer's special tokens"
                print(f"| {definition} | {name} | {row.quantity} | {_value(row)} | {inputs} |")


if __name__ == "__main__":
    {"leakage": leakage, "sinks": sinks}[sys.argv[1] if len(sys.argv) > 1 else "leakage"]()
