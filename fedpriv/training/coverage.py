"""What a run's epsilon does not cover, said next to it (issue 30: no silent non-private stage).

A DP run's guarantee covers the noisy steps or rounds of its mechanism on the *prepared* training
data. Three things around it are stated in the guarantee string of every train row:

* **the vocabulary** (:func:`vocabulary_note`): learned from the training users' raw word counts
  it is not private ("the vocabulary of the N most frequent training words is not private"); from
  a DP histogram (``[vocab] dp``) it is a separate DP stage, with its own unit, never added here;
* **filters before DP** (:func:`filter_group`): ``data.min_examples > 1`` and
  ``data.max_examples_per_user`` (each user's first N examples in source order) are not 1-stable
  at example level. Adding or removing one raw example changes up to k training examples: k = 2
  for the cap (an example early in a user's list pushes the N-th out), k = min(m, N) for a minimum
  of m (a user crossing the threshold brings or takes all its kept examples). The epsilon printed
  is with respect to the filtered dataset; on the raw data the example-level guarantee is the
  group guarantee over k examples (:func:`fedpriv.privacy.group.group_privacy`), with its numbers,
  for an add-or-remove-one epsilon with Gaussian noise only: a replace-one epsilon (fixed-size
  batches) holds N fixed, which a filter does not, and a correlated-noise schedule is by record
  index, so those guarantees say why they give no raw-data figure.
  Both filters act per user, so a user-level guarantee is unaffected (k = 1);
* **private statistics** logged on request (``--log-private-stats``): they are outside epsilon;
* **a warm start** (``[init] from``) from a run trained on the private users (not a run on the
  public split, ``data.train_on = "public"``): that run's privacy is not composed here
  (:func:`warm_start_note`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fedpriv.config import DataConfig, ExperimentConfig
from fedpriv.errors import FedprivError
from fedpriv.privacy.group import group_privacy, vacuous
from fedpriv.rundir import RunDir

#: The statement a run that logs private statistics carries (``training.log_private_stats``).
PRIVATE_STATS_WARNING = ("private statistics logged (--log-private-stats): the train rows hold the realized batch or cohort size, example "
                         "counts, delta norms and the unnoised loss, which epsilon does not cover; do not publish metrics.jsonl")
#: Said by every DP guarantee: what a run writes beside its model that no epsilon covers (docs/privacy.md).
DATA_FACTS_NOTE = ("not covered either: data.json and the summary's data notes and vocabulary counts (examples cut, words dropped, "
                   "pieces per word), each round's wall time, and the memorization audit's files (canaries.json names each canary's "
                   "sharers with the examples it replaced, all of them when p_e = 1; audit.json scores the model on chosen training "
                   "examples), exact statistics of the training data; release the model without them")


#: Why an example-level guarantee over filtered data gives no raw-data figure by group privacy.
NO_RAW_FIGURE_CORRELATED = ("under the correlated-noise mechanism's cyclic schedule a filter can move records between the fixed groups "
                            "(or change N, and with it the schedule), which its zero-out-one epsilon does not cover")
NO_RAW_FIGURE_REPLACE_ONE = ("fixed-size batches give a replace-one epsilon, which holds N fixed, and adding or removing a raw example "
                             "can change N after the filters; no group of replacements covers that")
#: ``vocabulary_record["users"]`` of a vocabulary learned from the public split (``data.public_fraction``).
PUBLIC_VOCAB_USERS = "public users"


def vocabulary_note(record: dict[str, Any] | None, cfg: ExperimentConfig) -> str | None:
    """What the guarantee says of the run's vocabulary (``task.vocabulary_record``), or None when
    it was not learned from this run's private data (the public split, another source) or the task
    keeps no record."""
    if not record or record.get("users") == PUBLIC_VOCAB_USERS:
        return None
    if str(record.get("source")) != str(cfg.data.source):
        return None  # another source: its own stage (the chain report states it)
    n = record.get("vocab_size")
    dp = record.get("dp")
    if dp:
        unit = dp.get("unit", "unit")
        return (f"the vocabulary is a separate DP stage, not included in this epsilon: ({dp.get('epsilon', float('nan')):.4g}, "
                f"{dp.get('delta', float('nan')):.3g})-DP per {unit} added or removed ({dp.get('mechanism')} histogram, vocab.dp)")
    if record.get("kind") == "word":
        tags = " (and the tag set)" if cfg.task.kind == "ner" else ""
        return f"the vocabulary of the {n} most frequent training words{tags} is not private (raw counts of the training users; vocab.dp makes it a DP stage)"
    return f"the vocabulary ({n} tokens, learned from the raw word counts of {record.get('users', 'the training users')}) is not private"


def warm_start_note(cfg: ExperimentConfig) -> str | None:
    """What the guarantee says of the run's warm start: None without one or when the run it starts
    from saw only public data (``data.train_on = "public"``: no privacy cost)."""
    if cfg.init is None:
        return None
    where = cfg.init.from_
    try:
        theirs = RunDir(where).experiment_config().data
    except FedprivError:  # unreadable: the warm start itself refuses it before training
        theirs = None
    if theirs is not None and theirs.train_on == "public":
        return None
    trained_on = "the private users" if theirs is None or str(theirs.source) == str(cfg.data.source) else f"{theirs.source}"
    return f"the parameters start from run {where} ([init] from), trained on {trained_on}: that run's privacy is not included in this epsilon"


def filter_group(data: DataConfig) -> tuple[int, str]:
    """(k, why): raw examples added or removed -> at most k training examples changed by the
    data filters (see the module docstring); (1, '') when they are 1-stable."""
    k, why = 1, []
    cap = data.max_examples_per_user
    if cap is not None:
        k = max(k, 2)
        why.append(f"data.max_examples_per_user = {cap} keeps each user's first {cap} examples in source order (one added example can push another out: 2)")
    if data.min_examples > 1:
        m = data.min_examples if cap is None else min(data.min_examples, cap)
        k = max(k, m)
        why.append(f"data.min_examples = {data.min_examples} drops users with fewer examples (one example can bring in or drop a user's {m})")
    return k, "; ".join(why)


@dataclass(frozen=True)
class Coverage:
    """The statements appended to a guarantee: ``notes`` (words) and, for an example-level
    guarantee, the filters' group size ``k`` with its reason (numbers computed per epsilon)."""

    notes: tuple[str, ...] = ()
    group_size: int = 1
    group_why: str = ""
    no_raw_figure: str = ""  # why no raw-data figure is given ('' = give it): see :func:`coverage`

    def statement(self, epsilon: float | None, delta: float | None) -> str:
        """The text after the guarantee ('' when there is nothing to add)."""
        parts = list(self.notes)
        if self.group_size > 1:
            text = f"epsilon is with respect to the filtered training data: {self.group_why}"
            if self.no_raw_figure:
                text += f"; no raw-data figure is given: {self.no_raw_figure}"
            elif epsilon is not None and delta is not None:
                ek, dk = group_privacy(epsilon, delta, self.group_size)
                if vacuous(dk):
                    text += (f"; no raw-data figure is given: adding or removing one example changes up to {self.group_size} training examples, "
                             f"and group privacy (Vadhan 2017, Lemma 2.2) over {self.group_size} gives a delta of 1 or more at this epsilon, "
                             "which bounds nothing")
                else:
                    text += (f"; on the raw data, adding or removing one example changes up to {self.group_size} training examples, so by group "
                             f"privacy (Vadhan 2017, Lemma 2.2) epsilon = {ek:.4g} at delta = {dk:.3g}")
            parts.append(text)
        return "; ".join(parts)


def coverage(cfg: ExperimentConfig, task: Any, unit: str, log_private_stats: bool = False) -> Coverage:
    """What the guarantee of ``unit`` (``example`` or ``user``) of a run of ``cfg`` with ``task``
    must add (see the module docstring)."""
    notes = [n for n in (vocabulary_note(getattr(task, "vocabulary_record", None), cfg), warm_start_note(cfg)) if n]
    if log_private_stats:
        notes.append(PRIVATE_STATS_WARNING)
    notes.append(DATA_FACTS_NOTE)
    k, why = filter_group(cfg.data) if unit == "example" else (1, "")
    p = cfg.privacy
    no_raw = ""
    if p is not None and p.mechanism != "gaussian":
        no_raw = NO_RAW_FIGURE_CORRELATED
    elif p is not None and p.sampling == "fixed":
        no_raw = NO_RAW_FIGURE_REPLACE_ONE
    return Coverage(tuple(notes), k, why, no_raw_figure=no_raw)
