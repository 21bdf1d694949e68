"""A finished run's summary, read back from its run directory (:mod:`fedpriv.rundir`): the one
builder of what ``summary.json``, the report and ``fedpriv train``'s printout say about a run."""

from __future__ import annotations

import os
from typing import Any

from fedpriv.config import VALIDATION, ExperimentConfig
from fedpriv.rundir import EMPIRICAL, PRIVATIZE, TOKENIZER, VOCABULARY, RunDir, along_audit
from fedpriv.strategies.server import STRATEGY_LABELS
from fedpriv.tasks.base import degenerate
from fedpriv.tasks.nwp import unigram_perplexity
from fedpriv.training.loop import LoopResult
from fedpriv.training.prepared import Prepared
from fedpriv.training.warmstart import utility_target, warm_start_record


#: A train row's privacy columns a summary carries: the strategy's, then client-side DP-SGD's.
PRIVACY_KEYS = ("epsilon", "delta", "guarantee", "epsilon_spent", "promised_steps", "client_epsilon", "client_delta", "client_guarantee")


def run_summary(
    name: str,
    kind: str,
    c: ExperimentConfig,
    run_dir: str | os.PathLike[str],
    seconds: float | None = None,
    starts_from: dict[str, str] | None = None,
    engine: str | None = None,
    group: str | None = None,
) -> dict[str, Any]:
    """What the report needs about a finished run, read back from its files: the last evaluation,
    the last epsilon with its guarantee, the audit summary; for BERT runs the vocabulary's record
    (its source and DP guarantee, from ``tokenizer.json``) and the runs it starts from
    (``starts_from``: task option -> run name), which the chain report composes. ``engine``: the
    engine a federated run used, when not its config's."""
    run = RunDir(run_dir)
    rows = run.metrics()
    train = [r for r in rows if r.get("split") == "train"]
    evals = [r for r in rows if r.get("split") not in (None, "train")]
    out: dict[str, Any] = {"name": name, "group": group or name, "kind": kind, "users": c.data.users, "task": c.task.kind, "data_source": c.data.source, "seed": c.seed}
    if c.canaries is not None:
        out["canary_seed"] = c.seed if c.canaries.seed is None else c.canaries.seed
    if c.data.eval_source:
        out["eval_source"] = c.data.eval_source
    if starts_from:
        out["starts_from"] = dict(starts_from)
    if c.init is not None:  # a warm start: the run it starts from, and whether that run saw only public data
        out["init"] = warm_start_record(c.init.from_)
    if c.data.train_on == "public":
        out["trained_on"] = "public"
    data = run.data_record()
    if data is not None and data["notes"]:  # choices the data preparation made on its own
        out["data_notes"] = data["notes"]
    public = ((data or {}).get("source") or {}).get("public")
    if public:  # the experiment's public data (users, examples, where from)
        out["public_data"] = public
    training = ((data or {}).get("cut") or {}).get("training") or {}
    if training.get("pieces_in") and training.get("words_in"):  # how finely the run's vocabulary splits its training words
        out["pieces_per_word"] = training["pieces_in"] / training["words_in"]
    if run.has(PRIVATIZE):  # local privatization of the training text, with its guarantee
        out["privatize"] = run.record(PRIVATIZE, "privatization record")
    if run.has(VOCABULARY):  # the run learned its vocabulary: the full record (raw-data figures included)
        out["vocabulary"] = run.record(VOCABULARY, "vocabulary record")
    elif run.has(TOKENIZER):  # inherited with the tokenizer: what a released tokenizer carries
        out["vocabulary"] = run.record(TOKENIZER, "tokenizer file").get("vocabulary")
    out["privacy_unit"] = privacy_unit(c, kind)
    if c.data.max_examples_per_user is not None:  # a bound on each user's examples (group privacy across units; a filter not 1-stable per example)
        out["max_examples_per_user"] = c.data.max_examples_per_user
    if c.data.min_examples > 1:  # a filter not 1-stable per example
        out["min_examples"] = c.data.min_examples
    if c.training.log_private_stats:  # the train rows hold statistics epsilon does not cover
        out["private_stats_logged"] = True
    if kind == "central":
        out.update(algorithm="DP-SGD" if c.privacy else ("SGD on public data" if c.data.train_on == "public" else "SGD"), order=c.training.order, batch_size=c.training.batch_size, steps=train[-1]["step"] if train else 0)
        if c.privacy:
            out.update(noise_multiplier_config=c.privacy.noise_multiplier, clip_norm=c.privacy.clip_norm, sampling=c.privacy.sampling)
            if c.privacy.unit == "user":
                out.update(algorithm="user-level DP-SGD", examples_per_user=c.privacy.examples_per_user)
    else:
        f = c.federated
        out.update(algorithm=STRATEGY_LABELS[f.strategy], clients_per_round=f.clients_per_round, rounds=train[-1]["round"] if train else 0, engine=engine or f.engine)
        if f.clip_norm is not None:
            out["clip_norm"] = f.clip_norm
    if train and train[-1].get("epsilon") is not None:  # DP runs only; the ledger has the rest
        out.update({k: train[-1][k] for k in PRIVACY_KEYS[:5] if k in train[-1]})
    if train and train[-1].get("client_epsilon") is not None:  # client-side DP-SGD (record-level)
        out.update({k: train[-1][k] for k in PRIVACY_KEYS[5:]})
    metric, label = run.utility()
    out.update(utility_metric=metric, utility_label=label)
    test = [r for r in evals if r["split"] != VALIDATION]
    if test:
        last_eval = test[-1]
        out["eval_split"] = last_eval["split"]
        out.update({f"eval_{k}": v for k, v in last_eval.items() if k not in ("split", "step", "round", "epoch")})
        out["utility"] = last_eval.get(metric)
        why = degenerate(last_eval)
        if why:
            out["degenerate"] = why
    validation = [r for r in evals if r["split"] == VALIDATION]
    if validation:
        out.update({f"validation_{k}": v for k, v in validation[-1].items() if k not in ("split", "step", "round", "epoch")})
    target = utility_target(c.utility, c.utility.metric or metric, c.data.train_on) if c.utility is not None else None
    if target is not None:
        out["target"] = target_record(c.utility.metric or metric, target, validation, kind)
        if c.utility.above is not None:
            out["target"]["above"] = {"run": RunDir(c.utility.above).path.name, "margin": c.utility.margin}
    audit = run.audit_summary()
    if audit is not None:
        out["audit"] = audit
    if run.has(EMPIRICAL):
        out["empirical"] = run.empirical()
    along = along_points(run, metric, validation, test)
    if along:
        out["along"] = along
    if seconds is not None:
        out["seconds"] = seconds
    return out


def privacy_unit(c: ExperimentConfig, kind: str) -> str | None:
    """What the run's DP guarantee protects: ``example``, ``user``, ``example (client-side)`` for
    client-side DP-SGD alone, or None for a run without DP."""
    if kind == "central":
        return c.privacy.unit if c.privacy is not None else None
    if c.federated.dp is not None:
        return "user"
    return "example (client-side)" if c.federated.client_dp is not None else None


def along_points(run: RunDir, metric: str, validation: list[dict[str, Any]], test: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Memorization against utility along training (``audit.along``): per audited step, the
    validation and test utility there and the audit's totals (memorized counts, exposure)."""
    out = []
    for step in run.snapshot_steps():
        if not run.has(along_audit(step)):
            continue
        total = run.along_audit(step)["summary"]["total"]
        at = lambda rows: next((r.get(metric) for r in rows if r["step"] == step), None)  # noqa: E731
        out.append({"step": step, "validation_utility": at(validation), "utility": at(test), **total})
    return out


def target_record(metric: str, value: float, validation: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    """Whether (and where) a run reached its utility target: the first validation evaluation at or
    past ``value``; else the best it reached."""
    at = "step" if kind == "central" else "round"
    hit = next((r for r in validation if r.get(metric, float("-inf")) >= value), None)
    best = max((r.get(metric) for r in validation if r.get(metric) is not None), default=None)
    return {"metric": metric, "value": value, "split": VALIDATION, "reached": hit is not None, "at": at,
            "when": hit.get(at, hit["step"]) if hit else None, "reached_value": hit[metric] if hit else best}


def train_summary(prepared: Prepared, kind: str, run_dir: str | os.PathLike[str], result: LoopResult, engine: str | None = None) -> dict[str, Any]:
    """``fedpriv train``'s summary of a run it just trained: the data's facts
    (:meth:`~fedpriv.training.prepared.Prepared.summary`), then the run's from
    :func:`run_summary` (final evaluation as ``final_*``, epsilon with its guarantee), whether it
    stopped early, and for central next-word prediction without DP the held-out unigram
    perplexity (a baseline any trained model should beat; it is an exact function of the training
    words' counts, so a DP run leaves it out)."""
    c = prepared.config
    rs = run_summary(c.name, kind, c, run_dir, engine=engine)
    out: dict[str, Any] = {**prepared.summary(), "run_dir": str(run_dir)}
    if kind == "central":
        out["steps"] = result.done  # the steps trained so far (train rows are logged only every log_every)
    else:
        out.update(engine=rs["engine"], strategy=c.federated.strategy, rounds=result.done)
    out.update({f"final_{k[len('eval_'):]}": v for k, v in rs.items() if k.startswith("eval_") and k not in ("eval_split", "eval_source")})
    out.update({k: rs[k] for k in PRIVACY_KEYS if k in rs})
    out.update({k: result.unlogged[k] for k in PRIVACY_KEYS if k in result.unlogged})  # halted between train rows: the epsilon of every step done
    if result.stopped:
        out["stopped"] = result.stopped
    if kind == "central" and c.task.kind == "nwp" and prepared.eval_arrays and c.privacy is None:
        name = next(iter(prepared.eval_arrays))
        out[f"{name}_unigram_perplexity"] = unigram_perplexity(prepared.train_arrays["ids"], prepared.eval_arrays[name]["ids"], len(prepared.task.vocab))
    return out
