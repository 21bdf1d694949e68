"""Build the task an experiment config names, from the training corpus only."""

from __future__ import annotations

import inspect

from fedpriv.config import ExperimentConfig
from fedpriv.data.corpus import FederatedCorpus
from fedpriv.errors import ConfigError, FedprivError
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
    if kind in ("mlm", "bert-ner"):
        return _build_bert(cfg, train)
    raise ConfigError(f"task.kind: unknown task {kind!r}")


def learn_tokenizer(train: FederatedCorpus, size: int, lowercase: bool):
    """A WordPiece vocabulary of at most ``size`` tokens learned from the words of the TRAINING
    users' examples (text split on spaces, or a tagged example's tokens), lowercased if asked."""
    from collections import Counter

    from fedpriv.vocab.wordpiece import learn_wordpiece

    counts: Counter = Counter()
    for ex in train.records():
        words = ex.words()
        counts.update([w.lower() for w in words] if lowercase else words)
    try:
        return learn_wordpiece(counts, size)
    except FedprivError as e:
        raise ConfigError(f"vocab.size: {e}") from None


def _build_bert(cfg: ExperimentConfig, train: FederatedCorpus) -> Task:
    """``mlm``: BERT masked-LM pretraining on text or tagged examples (the tokens as text).
    ``bert-ner``: BERT NER fine-tuning, from scratch or from ``task.options.pretrained`` (a
    finished BERT run directory, see :mod:`fedpriv.tasks.bert_run`: its tokenizer and encoder are
    used, ``vocab.size`` is not). Otherwise the WordPiece vocabulary (``vocab.size`` tokens at
    most) is learned from the training users only. ``task.model`` is the BERT preset."""
    from fedpriv.models.bert import PRESETS
    from fedpriv.tasks.bert_ner import BertNERTask
    from fedpriv.tasks.mlm import MLMTask

    kind = cfg.task.kind
    options = dict(cfg.task.options)
    if cfg.task.model not in PRESETS:
        raise ConfigError(f"task.model: unknown BERT preset {cfg.task.model!r}; choose one of {', '.join(PRESETS)}")
    if kind == "mlm":
        _check_options(MLMTask, options, {"tokenizer", "model"})
        tok = learn_tokenizer(train, cfg.vocab.size, bool(options.get("lowercase", False)))
        try:
            return MLMTask(tok, model=cfg.task.model, **options)
        except FedprivError as e:
            raise ConfigError(f"task: {e}") from None

    if train.kind != "tagged":
        raise ConfigError(f"task.kind = 'bert-ner' needs tagged examples; {train.name} has {train.kind} ones")
    _check_options(BertNERTask, options, {"tokenizer", "model"})
    path = options.pop("pretrained", None)
    records = list(train.records())
    if path is None:
        tok = learn_tokenizer(train, cfg.vocab.size, bool(options.get("lowercase", False)))
        try:
            return BertNERTask.from_examples(records, tok, model=cfg.task.model, **options)
        except FedprivError as e:
            raise ConfigError(f"task: {e}") from None

    from fedpriv.tasks.bert_run import check_compatible, load_pretrained

    pre = load_pretrained(path)
    lowercase = options.pop("lowercase", pre.tokenizer.lowercase)
    if bool(lowercase) != pre.tokenizer.lowercase:
        raise ConfigError(
            f"task.options.lowercase = {bool(lowercase)} but the pretrained tokenizer in {pre.run_dir} was learned with "
            f"lowercase = {pre.tokenizer.lowercase}; leave it out to use the pretrained run's setting"
        )
    try:
        task = BertNERTask.from_examples(records, pre.tokenizer.wordpiece, model=cfg.task.model, lowercase=lowercase, **options)
    except FedprivError as e:
        raise ConfigError(f"task: {e}") from None
    check_compatible(pre, task.cfg, cfg.task.model)
    task.pretrained = pre.encoder
    task.pretrained_from = pre.run_dir
    import jax

    jax.eval_shape(task.init_params, jax.random.key(0))  # a structure mismatch surfaces now, not at step 0
    return task
