"""``[[measure]]`` entries of an experiment: what eta means on an embedding space, into the run store.

Each entry (:class:`fedpriv.config.MeasureConfig`) is computed by ``fedpriv run`` after every run
of the experiment finished, with :mod:`fedpriv.privacy.local.measure`:

* plausible deniability (Qu et al. 2021, sec. 5.3): ``sample`` allowed tokens of the space, each
  perturbed ``trials`` times by M_txt (or Vickrey) at each eta; N_w = outputs equal to the input,
  S_w = distinct outputs;
* token inversion (sec. 5.4): the nearest-neighbour attack on M_rep-perturbed embeddings of the
  tokens of a real corpus (``inversion_source``; words, or the WordPiece pieces of the words for a
  BERT run's space), accuracy per eta.

Written into the store (``STORE/measure/NAME/``)::

    measure.json     config (resolved), the embedding space's description, deniability summary per
                     eta (quantiles of N_w and S_w), inversion accuracy per eta, the guarantee
                     statements (eta·d_chi per token, d = Euclidean distance between embeddings);
                     written last: the measurement is complete
    deniability.png  N_w and S_w over the measured tokens, one box per eta

An entry whose ``measure.json`` holds the same config is skipped; one whose config changed is
refused (:func:`check_measures`, before any training), as a changed run is. Randomness:
``jax.random.key(seed)``, folded with 0 for the deniability and 1 for the inversion (within each,
eta number j uses ``fold_in(., j)``), so a measurement is a function of its config and the space.

:func:`write_measurements` writes the report's ``measurements.md`` (one table per measurement).
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from fedpriv.config import MeasureConfig
from fedpriv.errors import FedprivError
from fedpriv.jsonio import read_json, write_json_atomic

MEASURE_DIR, MEASURE_FILE, PLOT_FILE = "measure", "measure.json", "deniability.png"
REPORT_FILE = "measurements.md"
FORMAT = "fedpriv-local-measure"
RUN_REF = "run:"


def measure_dir(store: str | Path, name: str) -> Path:
    return Path(store) / MEASURE_DIR / name


def _normalized(raw: Any) -> Any:
    """A stored config re-validated, so keys a newer schema adds with their defaults compare equal."""
    try:
        return MeasureConfig.model_validate(raw).model_dump()
    except ValidationError:  # an unreadable old config simply differs
        return raw


def check_measures(store: str | Path, measures: Sequence[MeasureConfig]) -> None:
    """Refuse a measurement whose stored ``measure.json`` was computed with another config."""
    for m in measures:
        path = measure_dir(store, m.name) / MEASURE_FILE
        if not path.is_file():
            continue
        old = read_json(path, "measurement")
        if not isinstance(old, dict) or _normalized(old.get("config")) != m.model_dump():
            raise FedprivError(
                f"{path.parent}: the [[measure]] {m.name!r} config changed since it was computed; delete that directory or use another --out"
            )


def embeddings_path(m: MeasureConfig, store: str | Path) -> str:
    """``embeddings`` with ``"run:NAME"`` resolved to that run's directory in ``store`` (which must
    hold the finished run); other specs as given (relative paths: against the current directory)."""
    if not m.embeddings.startswith(RUN_REF):
        return m.embeddings
    run = Path(store) / m.embeddings[len(RUN_REF):]
    if not (run / "summary.json").is_file():
        raise FedprivError(f"[[measure]] {m.name!r}: embeddings = {m.embeddings!r}, but {run} holds no finished run (no summary.json)")
    return str(run.resolve())


def _count(spec: int | str) -> int | None:
    return None if spec == "all" else int(spec)


def run_measure(store: str | Path, m: MeasureConfig, log: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Compute one measurement (module docstring) into ``STORE/measure/NAME/``; its record."""
    import jax

    from fedpriv.data.sources import open_corpus
    from fedpriv.privacy.local.embeddings import load_embeddings
    from fedpriv.privacy.local.mechanisms import guarantee_note
    from fedpriv.privacy.local.measure import corpus_words, plausible_deniability, plot_deniability, token_inversion

    def say(msg: str) -> None:
        if log is not None:
            log(f"[measure {m.name}] {msg}")

    t0 = time.perf_counter()
    path = embeddings_path(m, store)
    space = load_embeddings(path, m.max_words, say, pieces=True)
    say(f"embedding space {space.source}: {len(space):,} rows of dimension {space.dim}, {space.allowed.size:,} {space.unit}s may be output")
    key = jax.random.key(m.seed)
    pd = plausible_deniability(
        jax.random.fold_in(key, 0), space, m.etas, trials=m.trials, mechanism=m.mechanism, t=m.t, k=m.k, sample=_count(m.sample), log=say
    )
    inversion: dict[str, Any] | None = None
    if m.inversion_tokens != 0:
        corpus = open_corpus(str(m.inversion_source), format=m.inversion_format, **m.inversion_options)
        inv = token_inversion(jax.random.fold_in(key, 1), space, corpus_words(corpus), m.etas, max_tokens=_count(m.inversion_tokens))
        for eta, acc in zip(inv.etas, inv.accuracy):
            say(f"eta {eta:g}: inversion accuracy {acc:.4f} over {inv.tokens:,} {space.unit} positions of {corpus.name}")
        inversion = {"mechanism": "rep", "source": m.inversion_source, "corpus": corpus.name, "unit": space.unit, **inv.to_json()}
    out = measure_dir(store, m.name)
    out.mkdir(parents=True, exist_ok=True)
    plot_deniability(pd, out / PLOT_FILE)
    record = {
        "format": FORMAT,
        "version": 1,
        "name": m.name,
        "config": m.model_dump(),
        "embeddings_path": path,
        "embeddings": space.describe(),
        "unit": space.unit,
        "deniability": pd.to_json(),
        "inversion": inversion,
        "guarantee": {f"{e:g}": guarantee_note(e, m.mechanism) for e in m.etas},
        "inversion_guarantee": {f"{e:g}": guarantee_note(e, "rep") for e in m.etas} if inversion else None,
        "seconds": time.perf_counter() - t0,
    }
    write_json_atomic(out / MEASURE_FILE, record, indent=1)
    say(f"done in {record['seconds']:.1f} s: {out / MEASURE_FILE}")
    return record


def run_measures(store: str | Path, measures: Sequence[MeasureConfig], log: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
    """Every measurement not already in the store (same config: skipped; :func:`check_measures`
    refuses a changed one); their records, in order."""
    check_measures(store, measures)
    records = []
    for m in measures:
        path = measure_dir(store, m.name) / MEASURE_FILE
        if path.is_file():
            if log is not None:
                log(f"[measure {m.name}] complete, skipped")
            records.append(read_json(path, "measurement"))
            continue
        records.append(run_measure(store, m, log))
    return records


# ---- the report ------------------------------------------------------------------------------------
def read_measurements(store: str | Path) -> list[dict[str, Any]]:
    """The complete measurements of ``store``: in the order of ``experiment.json``'s ``measures``,
    then any other directory of ``STORE/measure`` by name."""
    root = Path(store) / MEASURE_DIR
    if not root.is_dir():
        return []
    order: list[str] = []
    exp = Path(store) / "experiment.json"
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
