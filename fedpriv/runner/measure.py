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

The report's ``measurements.md`` comes from :mod:`fedpriv.report.measurements`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import jax
from pydantic import ValidationError

from fedpriv.config import RUN_REF, MeasureConfig
from fedpriv.data.sources import open_corpus, split_format
from fedpriv.errors import FedprivError
from fedpriv.jsonio import read_json, write_json_atomic
from fedpriv.privacy.local.measure import corpus_words, plausible_deniability, plot_deniability, token_inversion
from fedpriv.privacy.local.mechanisms import guarantee_note
from fedpriv.rundir import MEASURE_FILE, PLOT_FILE, RunDir, measure_dir
from fedpriv.runner.embeddings import load_embeddings

FORMAT = "fedpriv-local-measure"


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
    if not RunDir(run).has_summary():
        raise FedprivError(f"[[measure]] {m.name!r}: embeddings = {m.embeddings!r}, but {run} holds no finished run (no summary.json)")
    return str(run.resolve())


def _count(spec: int | str) -> int | None:
    return None if spec == "all" else int(spec)


def run_measure(store: str | Path, m: MeasureConfig, log: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Compute one measurement (module docstring) into ``STORE/measure/NAME/``; its record."""
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
        fmt, options = split_format(m.inversion_format, m.inversion_options)
        corpus = open_corpus(str(m.inversion_source), format=fmt, **options)
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
