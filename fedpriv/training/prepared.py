"""A prepared experiment: what every trainer consumes (made by :func:`fedpriv.runner.prepare.prepare`).

The training users' corpus and the evaluation corpora, the task built on the training users only,
every record encoded once (training rows in corpus user order, so ``train.counts()`` cuts them
into users), the planted canaries and the [privatize] stage's record when there are any.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from fedpriv.config import ExperimentConfig
from fedpriv.data.corpus import FederatedCorpus
from fedpriv.errors import ConfigError
from fedpriv.memorization.canaries import Manifest
from fedpriv.memorization.empirical import AuditCanaries
from fedpriv.rundir import DATA, PRIVATIZE, RunDir
from fedpriv.tasks.base import Batch, Task
from fedpriv.tasks.base import Params
from fedpriv.training.loop import Target, check_resumable, init_key
from fedpriv.training.warmstart import load_warm_start, utility_target


@dataclass
class Prepared:
    config: ExperimentConfig
    train: FederatedCorpus
    eval: dict[str, FederatedCorpus]
    task: Task
    train_arrays: Batch
    eval_arrays: dict[str, Batch]
    canaries: Manifest | None = None
    #: What the [privatize] stage did (:func:`fedpriv.runner.privatize.privatize_training_corpus`).
    privatized: dict[str, Any] | None = None
    #: The empirical audit's canaries (``[audit] empirical``; :mod:`fedpriv.memorization.empirical`).
    audit_canaries: AuditCanaries | None = None
    #: What preparing decided on its own: notes, examples cut per split (:func:`fedpriv.runner.prepare.data_record`).
    data: dict[str, Any] | None = None
    #: The user allowed a delta >= 1/N (``--allow-large-delta``): checked data warns instead of refusing.
    allow_large_delta: bool = False

    def save_assets(self, run_dir: str | os.PathLike[str]) -> None:
        """What an audit or a later run needs besides the parameters: the task's assets (e.g. a
        tokenizer), the canary manifest, and ``privatize.json`` (the local-privacy stage: mechanism,
        parameters, embeddings and guarantee), and ``data.json`` (:attr:`data`). Vocabulary files
        that differ from the digests the run's ``config.json`` recorded are refused first
        (:meth:`fedpriv.rundir.RunDir.check_assets`), and so is a run to resume whose config changed
        (the loop would refuse it; its vocabulary must not be replaced first)."""
        run = RunDir(run_dir)
        run.check_assets()
        meta = run.config_meta()
        if run.checkpoint_meta() is not None and (meta is None or "experiment" in meta):  # (no config.json: refused)
            check_resumable(run, {**(meta or {}), "experiment": self.config.model_dump()})
        self.task.save_assets(run_dir)
        if self.canaries is not None:
            self.canaries.save(run_dir)
        if self.audit_canaries is not None:
            self.audit_canaries.save(run_dir)
        if self.privatized is not None:
            RunDir(run_dir).write_json(PRIVATIZE, self.privatized, indent=1)
        if self.data is not None:
            RunDir(run_dir).write_json(DATA, self.data, indent=1)

    def initial_params(self, seed: int) -> Params:
        """Where training starts: the final parameters of the run ``[init] from`` names (checked:
        same task, model and vocabulary; :mod:`fedpriv.training.warmstart`), else the task's
        fresh parameters of ``seed`` (the same for central and federated runs of one seed)."""
        init = self.config.init
        if init is None:
            return self.task.init_params(init_key(seed))
        return load_warm_start(init.from_, self.task, self.config.task.kind, self.config.task.model)

    def target_metric(self) -> str | None:
        """The metric of the ``[utility]`` target (default: the task's headline utility), or None
        without a target. ConfigError for a metric the task does not offer as a target: the stop
        rule is 'metric >= target', so only fractions where higher is better qualify."""
        u = self.config.utility
        if u is None:
            return None
        metric = u.metric or self.task.utility[0]
        allowed = self.task.target_metrics or (self.task.utility[0],)
        if metric not in allowed:
            raise ConfigError(f"utility.metric = {metric!r} is not a utility the {self.task.name} task can train to (a fraction where higher is "
                              f"better, reached when metric >= target); choose one of {', '.join(allowed)}")
        return metric

    def target(self) -> Target | None:
        """The experiment's utility target (``[utility]``) on the task's headline metric, or None."""
        metric = self.target_metric()
        if metric is None:
            return None
        value = utility_target(self.config.utility, metric, self.config.data.train_on)
        return None if value is None else Target(self.config.utility.split, metric, value)

    def summary(self) -> dict[str, Any]:
        """The data's facts: experiment, task, source, users and examples per split, vocabulary."""
        out: dict[str, Any] = {
            "experiment": self.config.name,
            "task": self.task.name,
            "source": self.train.name,
            "train_users": self.train.num_users,
            "train_examples": self.train.num_examples,
        }
        for name, c in self.eval.items():
            out[f"{name}_users"] = c.num_users
            out[f"{name}_examples"] = c.num_examples
        vocab = getattr(self.task, "vocab", None)
        if vocab is not None:
            out["vocab_size_with_specials"] = len(vocab)
        if self.canaries is not None:
            out["canaries"] = len(self.canaries.canaries)
            out["canary_insertions"] = self.canaries.total_insertions
        pretrained = getattr(self.task, "pretrained_from", None)
        if pretrained is not None:
            out["pretrained_from"] = str(pretrained)
        if self.privatized is not None:
            p = self.privatized
            out["privatized"] = f"{p['mechanism']} eta={p['eta']:g}" + (f" t={p['t']:g}" if p.get("t") is not None else "")
        if self.data and self.data["notes"]:
            out["notes"] = list(self.data["notes"])
        return out
