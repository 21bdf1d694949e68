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
* central DP-SGD with Poisson sampling (add or remove one example).

Any other DP stage on D (stream tuples, longer examples, fixed-size sampling, user-level
federated DP) is reported with its own guarantee and D is marked "not composed". A stage that
reads D without DP makes the chain not private on D; D that no stage reads is "not used".
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

NOT_USED, NOT_PRIVATE, NOT_COMPOSED = "not used", "not private", "not composed"


@dataclass(frozen=True)
class Stage:
    """One step of a chain: ``what`` (vocabulary / the task kind), the run, the data it read, and
    its guarantee on that data (epsilon None: no DP). ``composable``: the guarantee is about adding
    or removing one example (see the module docstring)."""

    run: str
    what: str
    source: str
    epsilon: float | None
    delta: float | None
    guarantee: str
    composable: bool


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
    return Stage(run, "vocabulary", rec.get("source", "?"), dp.get("epsilon"), dp.get("delta"), dp.get("guarantee", ""), composable)


def training_stage(s: Mapping[str, Any]) -> Stage:
    eps = s.get("epsilon")
    composable = eps is not None and s.get("kind") == "central" and s.get("sampling") == "poisson"
    guarantee = s.get("guarantee") or ("not private" if eps is None else "")
    return Stage(s["name"], s.get("task", "?"), s.get("data_source", "?"), eps, s.get("delta"), guarantee, composable)


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
    if not all(st.composable for st in on):
        bad = next(st for st in on if not st.composable)
        return {"status": NOT_COMPOSED, "epsilon": None, "delta": None, "stages": names,
                "why": f"{bad.what} ({bad.run}) protects another unit or relation: {bad.guarantee}"}
    eps, delta = sum(st.epsilon for st in on), sum(st.delta for st in on)
    return {"status": "private", "epsilon": eps, "delta": delta, "stages": names,
            "why": f"({eps:.4g}, {delta:.3g})-DP against adding or removing one example of {dataset_label(source)}: "
                   f"basic composition of {' + '.join(names)}"}


def private_sources(summaries: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """Sources that some DP stage of some chain reads (the datasets the chains protect), in order."""
    out: list[str] = []
    for name in summaries:
        if summaries[name].get("task") not in ("mlm", "bert-ner"):
            continue
        for st in chain_stages(name, summaries):
            if st.epsilon is not None and source_key(st.source) not in map(source_key, out):
                out.append(st.source)
    return out


def encoder_rows(summaries: Mapping[str, Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One row per masked-LM run that a fine-tuning run starts from (the pretrained encoders,
    Hoory et al. 2021 Table 2): its vocabulary, each stage's epsilon, the composed guarantee on
    every private source, its held-out MLM accuracy, its secret-sharer exposure, and the entity F1
    of every fine-tuning run that starts from it (keyed by the fine-tuning evaluation data)."""
    private = private_sources(summaries)
    rows = []
    for name, s in summaries.items():
        if s.get("task") != "mlm":
            continue
        tuned = [t for t in summaries.values() if t.get("task") == "bert-ner" and (t.get("starts_from") or {}).get("pretrained") == name]
        stages = chain_stages(name, summaries)
        vocab = summaries[chain_runs(name, summaries)[-1]].get("vocabulary") or {}  # the full record of the run that learned it
        audit = (s.get("audit") or {}).get("total", {})
        rows.append({
            "encoder": name,
            "fine_tuned": bool(tuned),
            "vocabulary": f"{dataset_label(vocab.get('source', '?'))}{' (DP)' if vocab.get('dp') else ''}",
            "vocab_size": vocab.get("vocab_size"),
            "pieces_per_word": vocab.get("pieces_per_word"),
            "stages": stages,
            "composed": {src: compose(stages, src) for src in private},
            "mlm_accuracy": s.get("eval_accuracy"),
            "mlm_eval": dataset_label(s["eval_source"]) if s.get("eval_source") else f"held-out users of {dataset_label(s.get('data_source', '?'))}",
            "exposure_mean_bits": audit.get("exposure_mean"),
            "f1": _f1_by_dataset(tuned),
        })
    return rows


def _eps(status: Mapping[str, Any]) -> str:
    if status["status"] == "private":
        return f"{status['epsilon']:.3g} (δ {status['delta']:.1g})"
    return "0 (not used)" if status["status"] == NOT_USED else ("∞ (" + status["status"] + ")")


def _pct(v: Any) -> str:
    return "-" if v is None else f"{100 * float(v):.1f}"


def _f1_by_dataset(tuned: list[Mapping[str, Any]]) -> dict[str, list[tuple[str, Any]]]:
    """Evaluation dataset -> [(fine-tuning run, entity F1), ...] in run order."""
    out: dict[str, list[tuple[str, Any]]] = {}
    for t in tuned:
        out.setdefault(dataset_label(t.get("eval_source") or t.get("data_source", "?")), []).append((t["name"], t.get("eval_f1")))
    return out


def _f1_cell(runs: list[tuple[str, Any]] | None) -> str:
    """One fine-tuning: its F1; several on the same data: each F1 with its run's name."""
    if not runs:
        return "-"
    if len(runs) == 1:
        return _pct(runs[0][1])
    return "; ".join(f"{_pct(f1)} ({name})" for name, f1 in runs)


def chains_markdown(summaries: Mapping[str, Mapping[str, Any]]) -> str:
    """``chains.md``: the encoders table, each stage's guarantee, and the vocabulary sizes."""
    rows = [r for r in encoder_rows(summaries) if r["fine_tuned"]]
    if not rows:
        return ""
    private = private_sources(summaries)
    datasets = list(dict.fromkeys(k for r in rows for k in r["f1"]))
    head = ["encoder", "vocabulary", "tokens", "pieces/word", *[f"ε on {dataset_label(p)}" for p in private],
            "MLM acc. (%) on", "exposure (bits) of max", *[f"F1 {d} (%)" for d in datasets]]
    lines = ["# Pretrained encoders and fine-tuning (Hoory et al. 2021, Table 2)", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r["encoder"], r["vocabulary"], str(r["vocab_size"]), f"{r['pieces_per_word']:.2f}" if r["pieces_per_word"] else "-",
                 *[_eps(r["composed"][p]) for p in private], f"{_pct(r['mlm_accuracy'])} {r['mlm_eval']}",
                 "-" if r["exposure_mean_bits"] is None else f"{r['exposure_mean_bits']:.2f} of {math.log2(r['vocab_size']):.2f}",
                 *[_f1_cell(r["f1"].get(d)) for d in datasets]]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "MLM accuracy is on each encoder's own evaluation data (named), so it compares encoders "
              "evaluated on the same data and vocabulary only. Exposure is the masked-LM secret sharer's mean over the "
              "canaries (log2 V - log2 rank of the secret among the V tokens); its maximum, log2 V, depends on the vocabulary.",
              "", "ε of the pretrained encoder (vocabulary and masked-LM stages; fine-tuning is not included: the "
              "fine-tuned taggers are not private on their own training data). Each stage, with its guarantee:", ""]
    for r in rows:
        lines.append(f"- **{r['encoder']}**:")
        for st in r["stages"]:
            eps = "no DP" if st.epsilon is None else f"ε = {st.epsilon:.4g}, δ = {st.delta:.3g}"
            lines.append(f"  - {st.what} on {dataset_label(st.source)} (run {st.run}): {eps}. {st.guarantee}")
        for p in private:
            c = r["composed"][p]
            if c.get("why"):
                lines.append(f"  - on {dataset_label(p)}: {c['why']}.")
    vocabs = [(n, s["vocabulary"]) for n, s in summaries.items()
              if s.get("task") == "mlm" and not (s.get("starts_from") or {}).get("pretrained") and (s.get("vocabulary") or {}).get("non_private")]
    if vocabs:
        lines += ["", "## DP versus non-private vocabulary (the same source, size and settings)", "",
                  "| run | source | DP tokens | non-private tokens | DP pieces/word | non-private pieces/word | token overlap |", "|---|---|---|---|---|---|---|"]
        for n, v in vocabs:
            np_ = v["non_private"]
            lines.append(f"| {n} | {dataset_label(v['source'])} | {v['vocab_size']} | {np_['vocab_size']} | {v['pieces_per_word']:.2f} | "
                         f"{np_['pieces_per_word']:.2f} | {np_['token_overlap_with_dp']:.3f} |")
        lines += ["", "The non-private figures are computed from the raw data, for comparison only; they are not released by the DP runs."]
    return "\n".join(lines) + "\n"
