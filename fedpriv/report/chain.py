"""Privacy and utility of model chains (Hoory et al. 2021): a vocabulary learned from a private
corpus, pretraining, continued pretraining, fine-tuning; each stage a run of one experiment.

A BERT run's summary records where its vocabulary came from (``vocabulary``: the source and, for
a DP histogram, its guarantee) and the run it starts from (``starts_from.pretrained``). The
stages of a run are its vocabulary's, then every training of its chain, first to last.

Composition, per dataset D (a data source): the stages that read D are composed by basic
composition (epsilons add, deltas add; Dwork and Roth 2014, Theorem 3.16). That needs every
stage's guarantee to be about the same neighbouring relation on D, adding or removing one
example, which holds for exactly these stages:

* DP-WordPiece (Gaussian tuple histogram) with ``partition = "example"``, when no example of D
  has more than N words (the record's ``longest_example_words``): each example is then one tuple;
* central example-level DP-SGD with Poisson sampling (add or remove one example).

Epsilons are composed only within one privacy unit and relation: a user-level stage (user-level
DP-SGD, DP-FedAvg) is never added to an example-level one. Any other DP stage on D (stream
tuples, longer examples, fixed-size sampling, another unit) is reported with its own guarantee and
D is marked "not composed": no single figure is printed. When stages of different units meet and
the runs record a bound k on each user's examples (``data.max_examples_per_user``), the why says
what group privacy gives per user (:func:`fedpriv.privacy.group.group_privacy`: an example-level
(eps, delta) is (k eps, delta * sum_{i<k} e^(i eps)) per user of at most k examples), with its
numbers, still without printing it as the chain's epsilon. A stage that reads D without DP makes
the chain not private on D; D that no stage reads is "not used".
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedpriv.privacy.group import group_privacy, vacuous
from fedpriv.report.intervals import interval

NOT_USED, NOT_PRIVATE, NOT_COMPOSED = "not used", "not private", "not composed"
#: The privacy unit of a run whose own training is not private but whose encoder is: its
#: epsilon is the encoder's (vocabulary and pretraining stages), per example of the same data.
ENCODER_UNIT = "example, encoder only"


@dataclass(frozen=True)
class Stage:
    """One step of a chain: ``what`` (vocabulary / the task kind), the run, the data it read, and
    its guarantee on that data (epsilon None: no DP). ``composable``: the guarantee is about adding
    or removing one example (see the module docstring). ``unit``: what the guarantee protects
    (``example``, ``user``, a histogram's tuple; None without DP or when not recorded);
    ``examples_per_user``: the run's bound on each user's examples (None: no bound)."""

    run: str
    what: str
    source: str
    epsilon: float | None
    delta: float | None
    guarantee: str
    composable: bool
    unit: str | None = None
    examples_per_user: int | None = None


def source_key(source: str) -> str:
    """A data source normalised for comparison (paths are compared as written, normalised)."""
    return os.path.normpath(source) if ("/" in source or os.sep in source) else source


def dataset_label(source: str) -> str:
    """A short name for a source: ``ncbi-disease/train.tsv`` for a path, the spec otherwise."""
    p = Path(source)
    return f"{p.parent.name}/{p.name}" if p.parent.name else source


def vocabulary_stage(run: str, rec: Mapping[str, Any]) -> Stage:
    dp = rec.get("dp")
    if not dp:
        return Stage(run, "vocabulary", rec.get("source", "?"), None, None, "not private: learned from the raw word counts", False)
    composable = (
        dp.get("mechanism") == "gaussian"
        and dp.get("partition") == "example"
        and int(rec.get("longest_example_words", math.inf)) <= int(dp.get("tuple_size", 0))
    )
    unit = "example" if composable else dp.get("unit")
    return Stage(run, "vocabulary", rec.get("source", "?"), dp.get("epsilon"), dp.get("delta"), dp.get("guarantee", ""), composable, unit)


def training_stage(s: Mapping[str, Any]) -> Stage:
    """A run's own training as a stage; composable only for central example-level DP-SGD with
    Poisson sampling (its summary's ``privacy_unit`` must say ``example``)."""
    eps = s.get("epsilon")
    unit = s.get("privacy_unit") if eps is not None else None
    composable = eps is not None and s.get("kind") == "central" and s.get("sampling") == "poisson" and unit == "example"
    guarantee = s.get("guarantee") or ("not private" if eps is None else "")
    bound = s.get("max_examples_per_user")
    bound = bound if isinstance(bound, int) and not isinstance(bound, bool) and bound >= 1 else None
    return Stage(s["name"], s.get("task", "?"), s.get("data_source", "?"), eps, s.get("delta"), guarantee, composable, unit, bound)


def chain_runs(name: str, summaries: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """Run ``name``, the run it starts from, and so on back to the first (which learned the vocabulary)."""
    seen: list[str] = []
    cur: str | None = name
    while cur is not None:
        if cur in seen:
            raise ValueError(f"run {name!r}: its chain loops through {cur!r}")
        seen.append(cur)
        cur = (summaries[cur].get("starts_from") or {}).get("pretrained")
    return seen


def chain_stages(name: str, summaries: Mapping[str, Mapping[str, Any]]) -> list[Stage]:
    """The stages of run ``name``: its chain's vocabulary, then each training, first to last."""
    seen = chain_runs(name, summaries)
    first = summaries[seen[-1]]
    stages = [vocabulary_stage(seen[-1], first["vocabulary"])] if first.get("vocabulary") else []
    return stages + [training_stage(summaries[n]) for n in reversed(seen)]


def compose(stages: Sequence[Stage], source: str) -> dict[str, Any]:
    """The chain's guarantee on ``source``: epsilon and delta (basic composition), or a status."""
    on = [st for st in stages if source_key(st.source) == source_key(source)]
    if not on:
        return {"status": NOT_USED, "epsilon": 0.0, "delta": 0.0, "stages": []}
    names = [f"{st.what} ({st.run})" for st in on]
    if any(st.epsilon is None for st in on):
        bad = next(st for st in on if st.epsilon is None)
        return {"status": NOT_PRIVATE, "epsilon": None, "delta": None, "stages": names, "why": f"{bad.what} ({bad.run}) reads it without DP"}
    units = list(dict.fromkeys(st.unit for st in on if st.unit in ("example", "user")))
    if len(units) > 1:
        return {"status": NOT_COMPOSED, "epsilon": None, "delta": None, "stages": names, "units": units, "why": across_units(on)}
    if not all(st.composable for st in on):
        bad = next(st for st in on if not st.composable)
        return {"status": NOT_COMPOSED, "epsilon": None, "delta": None, "stages": names,
                "why": f"{bad.what} ({bad.run}) protects another unit or relation: {bad.guarantee}"}
    eps, delta = sum(st.epsilon for st in on), sum(st.delta for st in on)
    return {"status": "private", "epsilon": eps, "delta": delta, "stages": names,
            "why": f"({eps:.4g}, {delta:.3g})-DP against adding or removing one example of {dataset_label(source)}: "
                   f"basic composition of {' + '.join(names)}"}


def across_units(on: Sequence[Stage]) -> str:
    """Why stages of different privacy units get no single epsilon: each stage's own guarantee
    and, where every user-level stage bounds each user's examples by k and every example-level
    stage is add-or-remove-one example, the example-level stages read per user by group privacy,
    with the numbers (basic composition of the user-level figures)."""
    each = "; ".join(f"{st.what} ({st.run}): {st.unit or 'unit not recorded'}-level (ε = {st.epsilon:.4g}, δ = {st.delta:.3g})" for st in on)
    out = f"its stages protect different units and are not added into one figure ({each})"
    users = [st for st in on if st.unit == "user"]
    examples = [st for st in on if st.unit == "example"]
    bounds = {st.examples_per_user for st in users}
    other = next((st for st in examples if not st.composable), None)
    if other is not None:  # group privacy over k examples needs add-or-remove-one example (a replace-one epsilon holds N fixed)
        return out + f"; no per-user figure: {other.what} ({other.run}) is not an add-or-remove-one example guarantee"
    if users and examples and len(users) + len(examples) == len(on) and len(bounds) == 1 and None not in bounds:
        k = bounds.pop()
        per_user = [group_privacy(st.epsilon, st.delta, k) for st in examples]
        eps = sum(e for e, _ in per_user) + sum(st.epsilon for st in users)
        delta = sum(d for _, d in per_user) + sum(st.delta for st in users)
        if vacuous(delta):
            return out + (f"; no per-user figure: per user of at most k = {k} examples, group privacy (Vadhan 2017, Lemma 2.2) "
                          "gives a delta of 1 or more, which bounds nothing")
        conv = ", ".join(f"{st.what} ({st.run}) ({st.epsilon:.4g}, {st.delta:.3g}) per example -> ({e:.4g}, {d:.3g}) per user"
                         for st, (e, d) in zip(examples, per_user))
        out += (f"; per user of at most k = {k} examples (data.max_examples_per_user), group privacy (k·ε, δ·Σ_(i<k) e^(i·ε); "
                f"Vadhan 2017, Lemma 2.2) gives {conv}; with the user-level stages by basic composition: ({eps:.4g}, {delta:.3g}) "
                f"per user, if every user-level stage is add-or-remove-one user")
    return out


def _dp_sources(stages: Sequence[Stage]) -> list[str]:
    out: list[str] = []
    for st in stages:
        if st.epsilon is not None and source_key(st.source) not in map(source_key, out):
            out.append(st.source)
    return out


def chain_privacy(name: str, summaries: Mapping[str, Mapping[str, Any]]) -> dict[str, Any] | None:
    """The privacy run ``name`` carries from its chain, on its own training data D: ``epsilon``,
    ``delta``, ``unit`` (a privacy unit; :data:`ENCODER_UNIT` when only the earlier stages are
    private on D) and ``assumptions``; None for a run with no earlier stage (it starts from no run
    and its vocabulary, if any, has no DP), or when a run of its chain has no summary.

    * every stage on D private and composable: the composed guarantee;
    * the run's own training reads D without DP but the earlier stages on D compose privately (a
      tagger fine-tuned without DP on the corpus its encoder was privately pretrained on): the
      encoder's guarantee, with unit :data:`ENCODER_UNIT` and the statement that the run's own
      model is not private on D;
    * otherwise the run's own guarantee (None: not private) and why the chain does not compose.
    The chain's guarantees on other datasets are appended to ``assumptions``."""
    s = summaries.get(name)
    if s is None:
        return None
    try:
        runs = chain_runs(name, summaries)
    except KeyError:
        return None
    vocab_dp = bool((summaries[runs[-1]].get("vocabulary") or {}).get("dp"))
    if len(runs) == 1 and not vocab_dp:
        return None
    stages = chain_stages(name, summaries)
    own, data = stages[-1], stages[-1].source
    full = compose(stages, data)
    unit = s.get("privacy_unit")
    if full["status"] == "private":
        out = {"epsilon": full["epsilon"], "delta": full["delta"], "unit": unit or "example", "assumptions": f"{full['why']}; {own.what} ({own.run}): {own.guarantee}"}
    elif full["status"] == NOT_USED:  # cannot happen (the run's own stage reads D); kept total
        return None
    else:
        earlier = compose(stages[:-1], data)
        if own.epsilon is None and earlier["status"] == "private":
            each = "; ".join(f"{st.what} ({st.run}): {st.guarantee}" for st in stages[:-1]
                             if st.epsilon is not None and source_key(st.source) == source_key(data))  # relation and sampling of each stage
            out = {"epsilon": earlier["epsilon"], "delta": earlier["delta"], "unit": ENCODER_UNIT,
                   "assumptions": f"the encoder it starts from: {earlier['why']} ({each}); this run's own training ({own.what}, {own.run}) reads "
                                  f"{dataset_label(data)} without DP, so its model is not private on {dataset_label(data)}"}
        else:
            out = {"epsilon": own.epsilon, "delta": own.delta, "unit": unit if own.epsilon is not None else None,
                   "assumptions": f"{own.guarantee}; the chain on {dataset_label(data)}: {full['status']} ({full['why']})"}
    for other in _dp_sources(stages):
        if source_key(other) != source_key(data):
            c = compose(stages, other)
            out["assumptions"] += f"; on {dataset_label(other)}: " + (c["why"] if c["status"] == "private" else f"{c['status']} ({c.get('why', '')})")
    return out


def private_sources(summaries: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """Sources that some DP stage of some chain reads (the datasets the chains protect), in order."""
    out: list[str] = []
    for name in summaries:
        if summaries[name].get("task") not in ("mlm", "bert-ner"):
            continue
        for src in _dp_sources(chain_stages(name, summaries)):
            if source_key(src) not in map(source_key, out):
                out.append(src)
    return out


def encoder_rows(summaries: Mapping[str, Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One row per masked-LM run that a fine-tuning run starts from (the pretrained encoders,
    Hoory et al. 2021 Table 2): its group and seed, its vocabulary (and the group of the run that
    learned it), each stage's epsilon, the composed guarantee on every private source, its MLM
    accuracy and where it was measured, its secret-sharer exposure, and the fine-tuning runs that
    start from it (entity F1 and pieces per word on their data, keyed by evaluation data)."""
    private = private_sources(summaries)
    rows = []
    for name, s in summaries.items():
        if s.get("task") != "mlm":
            continue
        tuned = [t for t in summaries.values() if t.get("task") == "bert-ner" and (t.get("starts_from") or {}).get("pretrained") == name]
        stages = chain_stages(name, summaries)
        root = chain_runs(name, summaries)[-1]
        vocab = summaries[root].get("vocabulary") or {}  # the full record of the run that learned it
        audit = (s.get("audit") or {}).get("total", {})
        rows.append({
            "encoder": name,
            "group": s.get("group") or name,
            "vocab_group": summaries[root].get("group") or root,
            "fine_tuned": bool(tuned),
            "vocabulary": f"{dataset_label(vocab.get('source', '?'))}{' (DP)' if vocab.get('dp') else ''}"
                          + (f" + {dataset_label(vocab['public_source'])} (public)" if vocab.get("public_source") else ""),
            "vocab_size": vocab.get("vocab_size"),
            "stages": stages,
            "composed": {src: compose(stages, src) for src in private},
            "mlm_accuracy": s.get("eval_accuracy"),
            "mlm_eval": dataset_label(s["eval_source"]) if s.get("eval_source") else f"held-out users of {dataset_label(s.get('data_source', '?'))}",
            "exposure_mean_bits": audit.get("exposure_mean"),
            "f1": _by_dataset(tuned, "eval_f1"),
            "pieces": _by_dataset(tuned, "pieces_per_word", key="data_source"),
        })
    return rows


def _by_dataset(tuned: list[Mapping[str, Any]], field: str, key: str = "eval_source") -> dict[str, list[tuple[str, Any]]]:
    """Dataset (the runs' ``key``) -> [(fine-tuning group, its ``field``), ...] in run order."""
    out: dict[str, list[tuple[str, Any]]] = {}
    for t in tuned:
        out.setdefault(dataset_label(t.get(key) or t.get("data_source", "?")), []).append((t.get("group") or t["name"], t.get(field)))
    return out


def _eps(status: Mapping[str, Any]) -> str:
    if status["status"] == "private":
        return f"{status['epsilon']:.3g} (δ {status['delta']:.1g})"
    return "0 (not used)" if status["status"] == NOT_USED else ("∞ (" + status["status"] + ")")


def _pct(v: Any) -> str:
    return "-" if v is None else f"{100 * float(v):.1f}"


def _estimate(values: Sequence[Any], scale: float = 100.0, fmt: str = ".1f") -> str:
    """Mean over seeds with its 95% bootstrap interval over seeds ('-' without values; the mean
    alone with one seed, or when a seed lacks the value)."""
    vals = [float(v) for v in values if v is not None]
    if not vals:
        return "-"
    if len(vals) < len(values) or len(vals) == 1:
        return format(scale * sum(vals) / len(vals), fmt)
    est = interval([[v] for v in vals])
    return f"{format(scale * est.mean, fmt)} [{format(scale * est.low, fmt)}–{format(scale * est.high, fmt)}]"


def _groups(rows: Sequence[Mapping[str, Any]]) -> dict[str, list[Mapping[str, Any]]]:
    out: dict[str, list[Mapping[str, Any]]] = {}
    for r in rows:
        out.setdefault(r["group"], []).append(r)
    return out


def _tuned_cell(seeds: Sequence[Mapping[str, Any]], field: str, dataset: str, scale: float = 100.0, fmt: str = ".1f", first: bool = False) -> str:
    """The fine-tuning runs' ``field`` on ``dataset`` over an encoder group's seeds: one
    fine-tuning group, its estimate; several (e.g. two fine-tuning recipes), each with its name
    (``first``: the first group's only, for a field they share)."""
    names = list(dict.fromkeys(g for r in seeds for g, _ in r[field].get(dataset, [])))[: 1 if first else None]
    if not names:
        return "-"
    cells = []
    for g in names:
        per_seed = [next((v for n, v in r[field].get(dataset, []) if n == g), None) for r in seeds]
        cells.append(_estimate(per_seed, scale, fmt))
    return cells[0] if len(names) == 1 else "; ".join(f"{c} ({g})" for c, g in zip(cells, names))


def chains_markdown(summaries: Mapping[str, Mapping[str, Any]]) -> str:
    """``chains.md``: the encoders (a group's seeds together) with their composed epsilon and the
    fine-tuned F1 (mean and 95% interval over seeds); the masked-LM accuracy in blocks of encoders
    evaluated on the same data with the same vocabulary (the only ones it compares); each stage's
    guarantee; the vocabularies' coverage."""
    rows = [r for r in encoder_rows(summaries) if r["fine_tuned"]]
    if not rows:
        return ""
    private = private_sources(summaries)
    groups = _groups(rows)
    datasets = list(dict.fromkeys(k for r in rows for k in r["f1"]))
    tuned_on = list(dict.fromkeys(k for r in rows for k in r["pieces"]))
    head = ["encoder", "seeds", "vocabulary", "tokens", *[f"pieces/word on {d}" for d in tuned_on],
            *[f"ε on {dataset_label(p)}" for p in private], *[f"tagger F1 on {d} (%)" for d in datasets]]
    lines = ["# Pretrained encoders and fine-tuning (Hoory et al. 2021, Table 2)", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, seeds in groups.items():
        r = seeds[0]
        cells = [name, str(len(seeds)), r["vocabulary"], str(r["vocab_size"]),
                 *[_tuned_cell(seeds, "pieces", d, 1.0, ".2f", first=True) for d in tuned_on],
                 *[_eps(r["composed"][p]) for p in private],
                 *[_tuned_cell(seeds, "f1", d) for d in datasets]]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "Tagger F1: entity F1 of the taggers fine-tuned from each encoder, on the named test data, every gold entity counted "
              "(one past the length limit is a miss); mean over seeds with its bootstrap interval over seeds (with two seeds, the range of "
              "the two, not a 95% interval). Pieces per word: "
              "how finely the encoder's vocabulary splits the fine-tuning data's words. "
              "ε: the encoder's vocabulary and pretraining stages composed (below); the fine-tuning is not included, and when it reads "
              "the same data without DP the tagger itself is not private on that data (comparison.md says so row by row).", ""]
    lines += ["## Masked-LM accuracy, compared only within a block", "",
              "Each block holds the encoders evaluated on the same data with the same vocabulary; accuracies of different blocks "
              "are not comparable (a smaller vocabulary makes each masked piece easier to guess). Exposure is the masked-LM secret "
              "sharer's mean over the canaries (log2 V - log2 rank of the secret among the V tokens), out of its maximum log2 V; its "
              "interval is over the seeds' means only (comparison.md's also resamples the canaries, so it is wider).", ""]
    blocks: dict[tuple[str, str], list[str]] = {}
    for name, seeds in groups.items():
        blocks.setdefault((seeds[0]["mlm_eval"], seeds[0]["vocab_group"]), []).append(name)
    for (where, vocab_group), names in blocks.items():
        v = groups[names[0]][0]
        lines += [f"**{where}**, vocabulary of run {vocab_group} ({v['vocabulary']}, {v['vocab_size']} tokens):", "",
                  "| encoder | seeds | MLM accuracy (%) | exposure (bits) of max |", "|---|---|---|---|"]
        for n in names:
            seeds = groups[n]
            exp = _estimate([r["exposure_mean_bits"] for r in seeds], 1.0, ".2f")
            of_max = "" if exp == "-" else f" of {math.log2(v['vocab_size']):.2f}"
            lines.append(f"| {n} | {len(seeds)} | {_estimate([r['mlm_accuracy'] for r in seeds])} | {exp}{of_max} |")
        lines.append("")
    lines += ["## Each encoder's stages and guarantee", "", "The first seed's chain (the other seeds' have the same stages and guarantees).", ""]
    for name, seeds in groups.items():
        r = seeds[0]
        lines.append(f"- **{name}**:")
        for st in r["stages"]:
            eps = "no DP" if st.epsilon is None else f"ε = {st.epsilon:.4g}, δ = {st.delta:.3g}"
            lines.append(f"  - {st.what} on {dataset_label(st.source)} (run {st.run}): {eps}. {st.guarantee}")
        for p in private:
            c = r["composed"][p]
            if c.get("why"):
                lines.append(f"  - on {dataset_label(p)}: {c['why']}.")
    return "\n".join(lines + vocabulary_lines(summaries)) + "\n"


def vocabulary_lines(summaries: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """The DP vocabularies learned by the experiment's runs, each on its private source: tokens and
    pieces per word of the released vocabulary, and, computed from the raw data for comparison only,
    those of the non-private vocabulary of the same size and, for a public-extended one, of its
    public part alone and of the histogram alone."""
    vocabs = [(n, s["vocabulary"]) for n, s in summaries.items()
              if s.get("task") == "mlm" and not (s.get("starts_from") or {}).get("pretrained") and (s.get("vocabulary") or {}).get("dp")]
    if not vocabs:
        return []
    out = ["", "## DP vocabularies on their private source", "",
           "| run | source | vocabulary | tokens | pieces/word | words added to the public part | public part alone: pieces/word | "
           "DP histogram alone: pieces/word | non-private: tokens | non-private: pieces/word |", "|---|---|---|---|---|---|---|---|---|---|"]
    for n, v in vocabs:
        pub, np_ = v.get("public") or {}, v.get("non_private") or {}
        def f(d: Mapping[str, Any], k: str = "pieces_per_word") -> str:
            return "-" if d.get(k) is None else (f"{d[k]:.2f}" if isinstance(d[k], float) else str(d[k]))
        kind = f"public ({dataset_label(v['public_source'])}) + DP words" if v.get("public_source") else "DP histogram only"
        out.append(f"| {n} | {dataset_label(v['source'])} | {kind} | {f(v, 'vocab_size')} | {f(v)} | {f(pub, 'words_added')} | "
                   f"{f(pub.get('public_only') or {})} | {f(pub.get('histogram_only') or {})} | {f(np_, 'vocab_size')} | {f(np_)} |")
    out += ["", "Pieces per word are over the private source's word occurrences. Only the released vocabulary is DP; the other "
            "figures are computed from the raw data for comparison and are not released by the runs."]
    return out
