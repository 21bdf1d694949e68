"""Build the task an experiment config names, from the training corpus only."""

from __future__ import annotations

import inspect

from fedpriv.config import ExperimentConfig
from fedpriv.data.corpus import FederatedCorpus
from fedpriv.errors import ConfigError
from fedpriv.tasks.base import Task


def _check_options(cls, options: dict, skip: set[str]) -> None:
    params = inspect.signature(cls.__init__).parameters
    unknown = sorted(set(options) - (set(params) - skip - {"self"}))
    if unknown:
        allowed = sorted(set(params) - skip - {"self"})
        raise ConfigError(f"task.options: unknown key(s) {', '.join(unknown)} for task {cls.name!r}; allowed: {', '.join(allowed)}")


def build_task(cfg: ExperimentConfig, train: FederatedCorpus) -> Task:
    kind = cfg.task.kind
    if kind == "nwp":
        from fedpriv.models.nwp import PRESETS
        from fedpriv.tasks.nwp import NWPTask
        from fedpriv.vocab.word import WordVocab

        if train.kind != "text":
            raise ConfigError(f"task.kind = 'nwp' needs text examples; {train.name} has {train.kind} ones")
        if cfg.task.model not in PRESETS:
            raise ConfigError(f"task.model: unknown NWP preset {cfg.task.model!r}; choose one of {', '.join(PRESETS)}")
        _check_options(NWPTask, cfg.task.options, {"vocab", "seq_len", "model"})
        vocab = WordVocab.build((ex.text for ex in train.records()), cfg.vocab.size)
        return NWPTask(vocab, cfg.vocab.seq_len, cfg.task.model, **cfg.task.options)
    if kind == "ner":
        from fedpriv.tasks.ner import NERTask

        if train.kind != "tagged":
            raise ConfigError(f"task.kind = 'ner' needs tagged examples; {train.name} has {train.kind} ones")
        return NERTask.from_examples(list(train.records()), **cfg.task.options)
    raise ConfigError(f"task.kind: unknown task {kind!r}")
