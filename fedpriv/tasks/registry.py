"""Build the task an experiment config names, from the training corpus only: a built-in task
(nwp, ner, mlm, bert-ner) or a plug-in (``task.kind = "package.module:ClassName"`` or an entry
point, :mod:`fedpriv.tasks.plugins`), built by its ``from_config``."""

from __future__ import annotations

import inspect

from fedpriv.config import BUILTIN_TASKS, ExperimentConfig
from fedpriv.data.corpus import FederatedCorpus
from fedpriv.errors import ConfigError, FedprivError
from fedpriv.tasks.base import Task
from fedpriv.tasks.plugins import plugin_class


def check_task(cfg: ExperimentConfig) -> None:
    """Refuse a plug-in task that cannot be imported, or that is given [vocab] keys it does not
    declare it reads (class attribute ``reads_vocab_config = True``), before any data is read."""
    if cfg.task.kind not in BUILTIN_TASKS:
        cls = plugin_class(cfg.task.kind)
        if cfg.vocab.custom and not getattr(cls, "reads_vocab_config", False):
            raise ConfigError(f"vocab.dp / vocab.source / vocab.alphabet / vocab.public: task {cfg.task.kind!r} does not read them "
                              "(a plug-in declares reads_vocab_config = True when its from_config does)")


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
        if cfg.vocab.dp is None:
            vocab = WordVocab.from_counts(train.flat_text().word_counts(), cfg.vocab.size)  # the same counts as splitting every text
            task = NWPTask(vocab, cfg.vocab.seq_len, cfg.task.model, **cfg.task.options)
            task.vocabulary_record = word_vocabulary_record(cfg, len(vocab.words), None)
            return task
        counts, record = dp_word_histogram(cfg, train)
        vocab = WordVocab.from_counts(counts, cfg.vocab.size)
        task = NWPTask(vocab, cfg.vocab.seq_len, cfg.task.model, **cfg.task.options)
        task.vocabulary_record = {**record, "vocab_size": len(vocab.words)}
        return task
    if kind == "ner":
        from fedpriv.tasks.ner import NERTask, normalize_token

        if train.kind != "tagged":
            raise ConfigError(f"task.kind = 'ner' needs tagged examples; {train.name} has {train.kind} ones")
        records = list(train.records())
        if cfg.vocab.dp is None:
            task = NERTask.from_examples(records, **cfg.task.options)
            task.vocabulary_record = word_vocabulary_record(cfg, len(task.vocab.words), None)
            return task
        if "word_counts" in cfg.task.options:
            raise ConfigError("task.options: unknown key(s) word_counts for task 'ner'")
        counts, record = dp_word_histogram(cfg, train, normalize_token)
        task = NERTask.from_examples(records, word_counts=counts, **cfg.task.options)
        task.vocabulary_record = {**record, "vocab_size": len(task.vocab.words)}
        return task
    if kind in ("mlm", "bert-ner"):
        return _build_bert(cfg, train)
    cls = plugin_class(kind)
    task = cls.from_config(cfg, train)
    if not isinstance(task, Task):
        raise ConfigError(f"task.kind = {kind!r}: {cls.__name__}.from_config returned a {type(task).__name__}, not a Task")
    return task


def word_vocabulary_record(cfg: ExperimentConfig, size: int, dp: dict | None) -> dict:
    """Where a word vocabulary (nwp, ner) came from: the training users, plain (``dp`` None) or a DP histogram."""
    return {"source": cfg.data.source, "users": "training users", "kind": "word", "dp": dp, "vocab_size": size}


def dp_word_histogram(cfg: ExperimentConfig, train: FederatedCorpus, transform=None) -> tuple[dict[str, float], dict]:
    """(noisy word counts, vocabulary record) of ``vocab.dp``'s histogram over the training users'
    words (each passed through ``transform`` if given): one word list per training example, or per
    training user with ``partition = "user"``; noise seeded by the experiment seed as for BERT's DP
    vocabulary. The record carries the histogram's parameters and guarantee (its own unit: a
    tuple, an example or a user, add or remove one) and the longest example in words (per user:
    the users counted and the most words of one), which decides whether the chain report may
    compose it with example-level DP-SGD."""
    from fedpriv.vocab.dp_histogram import corpus_user_words, dp_histogram

    v = cfg.vocab
    per_user = v.dp == "gaussian" and v.partition == "user"
    if per_user:
        sequences = corpus_user_words(train, transform)
    elif transform is None:
        sequences = (ex.words() for ex in train.records())
    else:
        sequences = ([transform(t) for t in ex.words()] for ex in train.records())
    longest, n = 0, 0

    def counted():
        nonlocal longest, n
        for words in sequences:
            longest, n = max(longest, len(words)), n + 1
            yield words

    try:
        hist = dp_histogram(counted(), v.dp, seed=cfg.seed, sigma=v.sigma, epsilon=v.epsilon, delta=v.delta, tuple_size=v.tuple_size, partition=v.partition)
    except FedprivError as e:
        raise ConfigError(f"vocab: {e}") from None
    if hist.words_kept == 0:
        raise ConfigError(
            f"vocab.dp: the DP histogram kept no word: all {hist.words_before:,} words fell below the threshold C = {hist.threshold:.6g} "
            f"({hist.units:,} {hist.params.unit}s); use less noise (larger epsilon or delta), a smaller tuple size, or more training users"
        )
    record = word_vocabulary_record(cfg, hist.words_kept, hist.to_dict())
    if per_user:
        record.update(users_counted=n, longest_user_words=longest, guarantee=hist.guarantee)
    else:
        record.update(examples=n, longest_example_words=longest, guarantee=hist.guarantee)
    return hist.counts, record


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


def bert_vocabulary(cfg: ExperimentConfig, train: FederatedCorpus, lowercase: bool):
    """(WordPiece tokenizer, vocabulary record) for a BERT task that learns its own vocabulary.

    Plain (no ``vocab.source``, ``dp`` or ``alphabet``): :func:`learn_tokenizer` on the training
    users. Otherwise :func:`fedpriv.vocab.build.build_vocab` on ``vocab.source`` (all its users) or
    the training users, from the DP histogram if ``vocab.dp``, DP noise seeded by the experiment
    seed. The record says where the vocabulary came from and, for DP, its guarantee; it is saved in
    ``tokenizer.json`` and travels with the tokenizer to every run that starts from this one."""
    import tempfile
    from pathlib import Path

    from fedpriv.vocab.wordpiece import WordPieceVocab

    v = cfg.vocab
    if not v.custom:
        tok = learn_tokenizer(train, v.size, lowercase)
        return tok, {"source": cfg.data.source, "users": "training users", "dp": None, "vocab_size": len(tok), "lowercase": lowercase}
    from fedpriv.vocab.build import build_vocab

    if v.source is None:
        corpus, source, users = train, cfg.data.source, "training users"
    else:
        from fedpriv.data.sources import open_corpus, split_format

        try:
            fmt, options = split_format(v.source_format, v.source_options)
            corpus = open_corpus(v.source, format=fmt, **options)
        except FedprivError as e:
            raise ConfigError(f"vocab.source: {e}") from None
        source, users = v.source, "all users"
    with tempfile.TemporaryDirectory(prefix="fedpriv-vocab-") as d:
        try:
            report = build_vocab(
                corpus, "wordpiece", v.size, v.dp, out_dir=d, epsilon=v.epsilon, sigma=v.sigma, delta=v.delta,
                tuple_size=v.tuple_size, partition=v.partition, seed=cfg.seed, lowercase=lowercase, alphabet=v.alphabet,
                public=v.public, public_format=v.public_format, public_options=v.public_options,
            )
        except FedprivError as e:
            raise ConfigError(f"vocab: {e}") from None
        tok = WordPieceVocab.load(Path(d) / "vocab.txt")
    keep = ("examples", "longest_example_words", "alphabet", "guarantee")
    record = {"source": source, "users": users, "dp": report["dp"], "vocab_size": len(tok), "lowercase": lowercase}
    record.update({k: report[k] for k in keep})
    record.update({k: report["vocabulary"][k] for k in ("pieces_per_word", "unk_rate")})
    if report.get("public"):  # the public text it extends (a setting), and what each part alone covers (raw-data figures)
        record["public_source"] = v.public
        record["public"] = report["public"]
    if report.get("non_private"):  # for the data owner: what the same vocabulary would be without DP
        record["non_private"] = {k: report["non_private"][k] for k in ("vocab_size", "pieces_per_word", "unk_rate", "token_overlap_with_dp")}
    return tok, record


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
    path = options.pop("pretrained", None)
    if options.get("freeze_token_embedding") and path is None:
        raise ConfigError("task.options.freeze_token_embedding needs task.options.pretrained (the table to keep fixed)")
    if options.get("privatize_eta") is not None:
        if path is None:
            raise ConfigError("task.options.privatize_eta needs task.options.pretrained: the user-side embedding table comes from the pretrained run")
        if cfg.privatize is not None:
            raise ConfigError("task.options.privatize_eta and [privatize] both privatize the training text; use one")
    if path is not None and cfg.vocab.custom:
        raise ConfigError(
            "vocab.source / vocab.dp / vocab.alphabet / vocab.public: this run starts from task.options.pretrained, whose tokenizer "
            "it uses; set the vocabulary in the run that learned it"
        )
    if kind == "mlm":
        _check_options(MLMTask, {**options, **({"pretrained": path} if path else {})}, {"tokenizer", "model"})
        if path is None:
            tok, record = bert_vocabulary(cfg, train, bool(options.get("lowercase", False)))
            try:
                task = MLMTask(tok, model=cfg.task.model, **options)
            except FedprivError as e:
                raise ConfigError(f"task: {e}") from None
            task.vocabulary_record = record
            return task
        from fedpriv.tasks.bert_run import load_pretrained

        pre = load_pretrained(path, full=True)
        lowercase = _pretrained_lowercase(options, pre)
        try:
            task = MLMTask(pre.tokenizer.wordpiece, model=cfg.task.model, lowercase=lowercase, **options)
        except FedprivError as e:
            raise ConfigError(f"task: {e}") from None
        return _start_from(task, pre, cfg)

    if train.kind != "tagged":
        raise ConfigError(f"task.kind = 'bert-ner' needs tagged examples; {train.name} has {train.kind} ones")
    _check_options(BertNERTask, {**options, **({"pretrained": path} if path else {})}, {"tokenizer", "model"})
    records = list(train.records())
    if path is None:
        tok, record = bert_vocabulary(cfg, train, bool(options.get("lowercase", False)))
        try:
            task = BertNERTask.from_examples(records, tok, model=cfg.task.model, **options)
        except FedprivError as e:
            raise ConfigError(f"task: {e}") from None
        task.vocabulary_record = record
        return task

    from fedpriv.tasks.bert_run import load_pretrained

    pre = load_pretrained(path)
    lowercase = _pretrained_lowercase(options, pre)
    try:
        task = BertNERTask.from_examples(records, pre.tokenizer.wordpiece, model=cfg.task.model, lowercase=lowercase, **options)
    except FedprivError as e:
        raise ConfigError(f"task: {e}") from None
    return _start_from(task, pre, cfg)


def _pretrained_lowercase(options: dict, pre) -> bool:
    """The pretrained tokenizer's lowercasing (popped from ``options``; a contradicting value is refused)."""
    lowercase = options.pop("lowercase", pre.tokenizer.lowercase)
    if bool(lowercase) != pre.tokenizer.lowercase:
        raise ConfigError(
            f"task.options.lowercase = {bool(lowercase)} but the pretrained tokenizer in {pre.run_dir} was learned with "
            f"lowercase = {pre.tokenizer.lowercase}; leave it out to use the pretrained run's setting"
        )
    return bool(lowercase)


def _start_from(task, pre, cfg: ExperimentConfig):
    """``task`` set to start from the pretrained run ``pre`` (its encoder, or for MLM its whole
    model), carrying the pretrained tokenizer's vocabulary record; checked before any training."""
    import jax

    from fedpriv.tasks.bert_run import check_compatible

    check_compatible(pre, task.cfg, cfg.task.model)
    task.pretrained = pre.params if pre.params is not None else pre.encoder
    task.pretrained_from = pre.run_dir
    task.vocabulary_record = pre.tokenizer.vocabulary
    jax.eval_shape(task.init_params, jax.random.key(0))  # a structure mismatch surfaces now, not at step 0
    return task
