"""The report's ``measurements.md``: the ``[[measure]]`` records of a run store (computed by
:mod:`fedpriv.runner.measure`), one table per measurement, with its plot."""

from __future__ import annotations

import json
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from fedpriv.config import RUN_REF
from fedpriv.jsonio import read_json
from fedpriv.rundir import EXPERIMENT, MEASURE_DIR, MEASURE_FILE, PLOT_FILE, measure_dir

REPORT_FILE = "measurements.md"


def read_measurements(store: str | Path) -> list[dict[str, Any]]:
    """The complete measurements of ``store``: in the order of ``experiment.json``'s ``measures``,
    then any other directory of ``STORE/measure`` by name."""
    root = Path(store) / MEASURE_DIR
    if not root.is_dir():
        return []
    order: list[str] = []
    exp = Path(store) / EXPERIMENT
    if exp.is_file():
        order = [str(m.get("name")) for m in json.loads(exp.read_text()).get("measures", []) if isinstance(m, dict)]
    found = sorted(p.name for p in root.iterdir() if (p / MEASURE_FILE).is_file())
    names = [n for n in order if n in found] + [n for n in found if n not in order]
    return [read_json(root / n / MEASURE_FILE, "measurement") for n in names]


def _range(q: Mapping[str, float]) -> str:
    return f"{q['p50']:.4g} ({q['p5']:.4g}–{q['p95']:.4g})"


def measurement_lines(rec: Mapping[str, Any], plot: str | None = None) -> list[str]:
    """One measurement as Markdown: what was measured, the table, the guarantee, the plot."""
    c, d, e = rec["config"], rec["deniability"], rec["embeddings"]
    unit = rec.get("unit", "word")
    inv = rec.get("inversion") or {}
    acc = inv.get("accuracy", {})
    mech = d["mechanism"] if d.get("t") is None else f"{d['mechanism']} (t = {d['t']:g}, k = {c['k']})"
    space = f"{e['rows']:,} rows of dimension {e['dim']}, {e['allowed_outputs']:,} {unit}s may be output"
    if e.get("kind") == "fedpriv-bert-run":
        space += f" (WordPiece pieces of a {e.get('task')} run" + (", lowercased input" if e.get("lowercase") else "") + ")"
    origin = "that run's final parameters" if c["embeddings"].startswith(RUN_REF) else e["source"]
    lines = [
        f"## {rec['name']}",
        "",
        f"**Embedding space**: `{c['embeddings']}` ({origin}): {space}.",
        "",
        f"**Plausible deniability**: {mech}, {d['trials']:,} perturbations of each of {d['tokens']:,} {unit}s "
        f"({'all allowed' if c['sample'] == 'all' else 'a random sample of the allowed ones'}; seed {c['seed']}).",
    ]
    if inv:
        lines += [
            "",
            f"**Inversion**: M_rep on {inv['tokens']:,} {unit} positions of `{inv['source']}` ({inv['distinct_tokens']:,} distinct; "
            f"{inv['skipped_out_of_vocabulary']:,} positions of {unit}s the space cannot output skipped).",
        ]
    header = ["eta", "median N_w (p5–p95)", "median S_w (p5–p95)", "inversion accuracy"]
    rows = []
    for s in d["summary"]:
        a = acc.get(f"{s['eta']:g}")
        rows.append([f"{s['eta']:g}", _range(s["N_w"]), _range(s["S_w"]), "—" if a is None else f"{a:.1%}"])
    lines += ["", "| " + " | ".join(header) + " |", "|" + "|".join(["---"] * len(header)) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    etas = list(rec["guarantee"])
    if etas:
        first = rec["guarantee"][etas[0]]
        rest = f" At eta = {', '.join(etas[1:])}: the same with that eta." if len(etas) > 1 else ""
        lines += ["", f"**Guarantee** (per token): {first}{rest}"]
    if plot:
        lines += ["", f"![N_w and S_w of {rec['name']}]({plot})"]
    return lines


def measurements_markdown(records: Sequence[Mapping[str, Any]], plots: Mapping[str, str] | None = None) -> str:
    """The whole measurements.md: how to read the tables, then one section per measurement."""
    lines = [
        "# Local privacy measurements",
        "",
        "What eta means on each embedding space (Qu et al. 2021, sec. 5.3-5.4). **N_w**: of the perturbations of a token w "
        "by the mechanism, how many returned w itself (smaller: more deniable); **S_w**: how many distinct tokens they "
        "returned (larger: more deniable); each cell is the median over the measured tokens with the 5th and 95th "
        "percentiles. **Inversion accuracy**: the fraction of corpus positions whose M_rep-perturbed embedding has the "
        "original token as its nearest allowed token (the nearest-neighbour attack; lower: better privacy).",
        "",
    ]
    for rec in records:
        lines += measurement_lines(rec, (plots or {}).get(rec["name"])) + [""]
    return "\n".join(lines).rstrip() + "\n"


def write_measurements(store: str | Path, out: str | Path) -> Path | None:
    """``out/measurements.md`` and ``out/deniability-NAME.png`` for the store's measurements (stale
    ones removed first); the Markdown's path, or None when the store has none."""
    out = Path(out)
    (out / REPORT_FILE).unlink(missing_ok=True)
    for stale in out.glob("deniability-*.png"):
        stale.unlink()
    records = read_measurements(store)
    if not records:
        return None
    plots = {}
    for rec in records:
        src = measure_dir(store, rec["name"]) / PLOT_FILE
        if src.is_file():
            plots[rec["name"]] = f"deniability-{rec['name']}.png"
            shutil.copyfile(src, out / plots[rec["name"]])
    path = out / REPORT_FILE
    path.write_text(measurements_markdown(records, plots), encoding="utf-8")
    return path
