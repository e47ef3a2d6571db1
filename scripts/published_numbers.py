"""The published-numbers table of docs/howto/leakage.md, from a run: positional leakage on the embedded
models in both modes, beside the authors' published Llama-3.2-1B numbers.

    .venv/bin/python scripts/published_numbers.py            # prints the markdown table
"""

import lens_position as lp
from lens_position.analyses.leakage import published_table


def main() -> None:
    results = {}
    for name in ("smollm2-135m", "gemma3-270m"):
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


if __name__ == "__main__":
    main()
