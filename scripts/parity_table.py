"""Write the parity table of docs/howto/which-transformerlens.md from the measurement itself.

Runs :func:`measure_parity` (tests/helpers/parity.py: the same prompts through the ``hooked``
and ``bridge`` backends, TransformerLens 3.x) on the tiny models and replaces everything between
``<!-- parity-table:start -->`` and ``<!-- parity-table:end -->`` with one row per quantity: its
tolerance and, per model, the largest absolute difference measured. Columns of models not
measured in this run (the real models, unless ``--real``) are kept as they were recorded.
tests/unit/models/test_backend_parity.py fails when the tolerances differ from the tests' or
when a tiny model's recorded numbers differ by a factor of ten or more from what it measures.

    python scripts/parity_table.py                  # the four tiny models (about a minute each)
    python scripts/parity_table.py --real           # also SmolLM2-135M and Gemma-3-270M at T = 600
    python scripts/parity_table.py --only smollm2-135m gemma3-270m --forward-only
    python scripts/parity_table.py --check          # fail if the block's tolerances are stale
    python scripts/parity_table.py --tolerances-only  # rewrite the tolerances, keep the measured numbers
"""

from __future__ import annotations

import argparse
import datetime
import math
import re
import sys
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "helpers"))

from parity import REAL_TOLERANCES, TOLERANCES, measure_parity  # noqa: E402

START, END = "<!-- parity-table:start -->", "<!-- parity-table:end -->"
PAGE = ROOT / "docs" / "howto" / "which-transformerlens.md"
TINY_MODELS = ("tiny-llama", "tiny-mistral", "tiny-qwen2", "tiny-gemma3")
TINY_SETTINGS = dict(T=40, N=4)  # T beyond tiny-mistral's window (32) and tiny-gemma3's (16)
# T > 512 so that Gemma-3-270M's window (512) bites; N and the swept layers kept small for a CPU
REAL_MODELS = {"smollm2-135m": dict(T=600, N=2, sweep_layers=[0, 15, 29]),
               "gemma3-270m": dict(T=600, N=2, sweep_layers=[0, 5, 17])}
_HEADER = re.compile(r"^`(?P<model>[^`]+)` \(T = (?P<T>\d+), N = (?P<N>\d+), (?P<date>[0-9-]+)\)$")


def format_value(value: float) -> str:
    """A measured difference or tolerance as the table writes it: ``0`` or two significant digits."""
    return "0" if value == 0 else f"{value:.1e}"


def parse_value(text: str) -> float:
    return float(text.strip())


REAL_HEADER = "tolerance (real models, T = 600)"


def parse_block(page: str) -> tuple[dict[str, float], dict[str, float], dict[str, dict]]:
    """(tolerances, real-model tolerances, recorded) read back from the page's block:
    ``recorded[model] = {"T", "N", "date", "values": {quantity: difference}}``."""
    block = page.split(START, 1)[1].split(END, 1)[0]
    rows = [line for line in block.splitlines() if line.startswith("|")]
    header = [cell.strip() for cell in rows[0].strip("|").split("|")]
    assert header[:3] == ["quantity", "tolerance", REAL_HEADER], header
    models = []
    for cell in header[3:]:
        match = _HEADER.match(cell)
        assert match, f"column header {cell!r} is not `model` (T = .., N = .., date)"
        models.append(match.groupdict())
    tolerances: dict[str, float] = {}
    real: dict[str, float] = {}
    recorded = {m["model"]: {"T": int(m["T"]), "N": int(m["N"]), "date": m["date"], "values": {}} for m in models}
    for line in rows[2:]:
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        quantity = cells[0]
        tolerances[quantity] = parse_value(cells[1])
        if cells[2] != "–":
            real[quantity] = parse_value(cells[2])
        for model, cell in zip(models, cells[3:]):
            if cell != "–":
                recorded[model["model"]]["values"][quantity] = parse_value(cell)
    return tolerances, real, recorded


def render(recorded: dict[str, dict], versions: str) -> str:
    names = list(recorded)
    lines = [f"| quantity | tolerance | {REAL_HEADER} |" + "".join(
        f" `{n}` (T = {recorded[n]['T']}, N = {recorded[n]['N']}, {recorded[n]['date']}) |" for n in names),
        "|---|---|---|" + "---|" * len(names)]
    for quantity, tolerance in TOLERANCES.items():
        cells = [format_value(recorded[n]["values"][quantity]) if quantity in recorded[n]["values"] else "–"
                 for n in names]
        real = format_value(REAL_TOLERANCES[quantity]) if quantity in REAL_TOLERANCES else "–"
        lines.append(f"| {quantity} | {format_value(tolerance)} | {real} |" + "".join(f" {cell} |" for cell in cells))
    head = ("Largest absolute difference between the backends, measured by "
            "`measure_parity` (tests/helpers/parity.py) and written here by `scripts/parity_table.py` "
            f"({versions}, CPU, float32; natural-text prompts, seed 0, 200 bootstrap replicates). "
            "–: not in the recorded run (`--forward-only` measures a real model's forward pass only).")
    return "\n".join([head, "", *lines])


def versions() -> str:
    return ", ".join(f"{name} {metadata.version(name)}" for name in ("transformer-lens", "transformers", "torch"))


def within_a_factor_of_ten(recorded: float, measured: float, floor: float = 1e-9) -> bool:
    """Whether two measured differences have the same order of magnitude (ratio below 10; values
    below ``floor``, exact zeros included, count as ``floor``)."""
    a, b = max(recorded, floor), max(measured, floor)
    return abs(math.log10(a) - math.log10(b)) < 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--real", action="store_true", help="also measure SmolLM2-135M and Gemma-3-270M (minutes)")
    parser.add_argument("--forward-only", action="store_true",
                        help="for the real models, measure the forward pass only (logits, scores, patterns, masks)")
    parser.add_argument("--only", nargs="*", help="measure only these models (others keep their recorded columns)")
    parser.add_argument("--check", action="store_true", help="fail if the block's tolerances are not the tests'")
    parser.add_argument("--tolerances-only", action="store_true",
                        help="measure nothing: rewrite the tolerance column, keep the recorded differences")
    args = parser.parse_args()
    page = PAGE.read_text(encoding="utf-8")
    if START not in page or END not in page:
        print(f"{PAGE} has no {START} ... {END} block", file=sys.stderr)
        return 2
    tolerances, real, _ = parse_block(page)
    if args.check:
        if (tolerances, real) != (TOLERANCES, REAL_TOLERANCES):
            print(f"{PAGE}: the parity table's tolerances are not tests/helpers/parity.py's", file=sys.stderr)
            return 1
        return 0
    plan = {} if args.tolerances_only else {name: TINY_SETTINGS for name in TINY_MODELS}
    if args.real and not args.tolerances_only:
        plan.update(REAL_MODELS)
    if args.only and not args.tolerances_only:
        plan = {name: {**TINY_SETTINGS, **REAL_MODELS.get(name, {})} for name in args.only}
    for name, settings in plan.items():
        forward_only = args.forward_only and name in REAL_MODELS
        parity = measure_parity(name, **settings, analyses=not forward_only)
        _write({name: {"T": parity.T, "N": parity.N, "date": datetime.date.today().isoformat(),
                       "values": parity.differences}})  # first: a measurement takes minutes
        # a real model's forward quantities have tolerances of their own; its analyses are held to the tiny models'
        limits = {**TOLERANCES, **REAL_TOLERANCES} if name in REAL_MODELS else TOLERANCES
        print(f"{name}: {parity.seconds:.0f} s, over tolerance: {parity.over_tolerance(limits) or 'none'}; "
              f"verdicts equal: {parity.verdicts['hooked'] == parity.verdicts['bridge']}",
              file=sys.stderr)
    if not plan:
        _write({})
    return 0


def _write(measured: dict[str, dict]) -> None:
    """Put ``measured`` into the page's block, keeping every other recorded column (the page is read
    again: a measurement takes minutes)."""
    order = [*TINY_MODELS, *REAL_MODELS]
    page = PAGE.read_text(encoding="utf-8")
    recorded = {**parse_block(page)[2], **measured}
    recorded = {name: recorded[name] for name in sorted(recorded, key=lambda n: order.index(n) if n in order else 99)}
    before, rest = page.split(START, 1)
    _, after = rest.split(END, 1)
    PAGE.write_text(f"{before}{START}\n{render(recorded, versions())}\n{END}{after}", encoding="utf-8")


if __name__ == "__main__":
    sys.exit(main())
