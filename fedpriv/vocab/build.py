"""Build a vocabulary (word, WordPiece or SentencePiece), plain or from a DP histogram, with a report.

:func:`build_vocab` streams the source once, counting both the plain word histogram and the DP
mechanism's histogram; learns the vocabulary from the DP histogram (or the plain one without
``dp``); learns the same kind from the plain histogram too, so the report shows what privacy
costs; and writes the vocabulary files and ``report.json`` into ``out_dir`` atomically (everything
is staged in a sibling folder and moved in at the end; on error nothing is written).

Only the vocabulary files and the mechanism's parameters are covered by the DP guarantee. The
other figures of the report (distinct words, words dropped, the non-private vocabulary's figures,
coverage) are computed from the raw data: they are for the data owner, not for publication. The
non-private vocabulary itself is never written.

Files: ``kind="word"``: ``vocab.json`` (:class:`~fedpriv.vocab.word.WordVocab`, ``size`` words plus
4 specials); ``"wordpiece"``: ``vocab.txt`` (BERT format, ``size`` tokens in all); ``"sentencepiece"``:
``spm.model`` and ``spm.vocab`` (at most ``size`` pieces in all; unigram training on a histogram
whose total count exceeds 5 million sees it scaled down, see :mod:`fedpriv.vocab.spm`). With ``dp``, also
``histogram.tsv``: the released noisy histogram (``word<TAB>count``, rounded), which is DP too.

Noise: ``seed=None`` draws the histogram's noise from a generator seeded by the OS's CSPRNG
(128 bits, never stored); an int seed is reproducible (simulation: anyone with it can remove the
noise). The report never holds the seed, only which of the two it was (``"noise"``).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import string
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

from fedpriv.data.corpus import FederatedCorpus
from fedpriv.errors import EmptyCorpusError, FedprivError, PrivacyParameterError
from fedpriv.vocab.dp_histogram import (
    DEFAULT_TUPLE_SIZE,
    MECHANISMS,
    UserCounter,
    WordCounter,
    corpus_word_batches,
    counter_for,
    mechanism_params,
    release,
)

KINDS = ("word", "wordpiece", "sentencepiece")
#: Public character sets a WordPiece vocabulary can always hold (data-independent: no privacy cost).
ALPHABETS = {"data": "", "ascii": string.ascii_letters + string.digits + string.punctuation}


def public_alphabet(name: str, lowercase: bool = False) -> str:
    """The characters of the public alphabet ``name`` (``data``: none, learn them all from the data)."""
    if name not in ALPHABETS:
        raise FedprivError(f"alphabet must be one of {', '.join(ALPHABETS)}, got {name!r}")
    chars = ALPHABETS[name]
    return "".join(dict.fromkeys(c.lower() for c in chars)) if lowercase else chars
#: Coverage figures are computed over at most this many of the most frequent distinct words.
EVAL_MAX_WORDS = 500_000
NOT_PRIVATE_NOTE = (
    "Only the vocabulary files, histogram.tsv and the DP parameters are covered by the guarantee; the other "
    "figures here (distinct words, words dropped, the non-private vocabulary, coverage) are computed from the raw "
    "data and are for the data owner only."
)


def _check_size(kind: str, size: object) -> int:
    if isinstance(size, bool) or not isinstance(size, int):
        raise FedprivError(f"size must be an integer, got {size!r}")
    least = {"word": 1, "wordpiece": 7, "sentencepiece": 4}[kind]
    if size < least:
        raise FedprivError(f"size must be >= {least} for a {kind} vocabulary, got {size}")
    return size


def _learn(
    kind: str, counts: dict[str, float], size: int, folder: Path, model_type: str, min_pair_count: float, alphabet: str = ""
) -> tuple[Any, list[str]]:
    """The vocabulary of ``kind`` learned from ``counts``, saved into ``folder``; (vocab, file names)."""
    if kind == "word":
        from fedpriv.vocab.word import WordVocab

        vocab = WordVocab.from_counts(counts, size)
        vocab.save(folder / "vocab.json")
        return vocab, ["vocab.json"]
    if kind == "wordpiece":
        from fedpriv.vocab.wordpiece import learn_wordpiece

        vocab = learn_wordpiece(counts, size, min_pair_count=min_pair_count, alphabet=alphabet)
        vocab.save(folder / "vocab.txt")
        return vocab, ["vocab.txt"]
    from fedpriv.vocab.spm import train_sentencepiece

    model = train_sentencepiece(counts, folder, vocab_size=size, model_type=model_type, prefix="spm")
    return model, ["spm.model", "spm.vocab"]


def _figures(kind: str, vocab: Any, true_counts: Counter) -> dict:
    """Vocabulary size and how it covers the raw word occurrences (weighted by their true counts):
    ``oov_rate`` (word), or ``pieces_per_word`` and ``unk_rate`` (fraction of occurrences whose
    word holds an unknown piece) for the subword kinds."""
    top = true_counts.most_common(EVAL_MAX_WORDS) if len(true_counts) > EVAL_MAX_WORDS else list(true_counts.items())
    total = float(sum(c for _, c in top)) or 1.0
    out: dict[str, Any] = {}
    if kind == "word":
        out["vocab_size"] = len(vocab.words)
        out["ids_with_specials"] = len(vocab)
        index = vocab._index
        out["oov_rate"] = sum(c for w, c in top if w not in index) / total
        tokens = set(vocab.words)
    elif kind == "wordpiece":
        out["vocab_size"] = len(vocab)
        pieces = unk = 0.0
        for w, c in top:
            t = vocab.tokenize_word(w)
            pieces += c * len(t)
            if t[0] == vocab.unk_token and len(t) == 1:
                unk += c
        out["pieces_per_word"] = pieces / total
        out["unk_rate"] = unk / total
        tokens = set(vocab.tokens)
    else:
        sp = vocab.processor()
        out["vocab_size"] = sp.get_piece_size()
        if vocab.count_scale != 1.0:
            out["count_scale"] = vocab.count_scale
        words = [w for w, _ in top]
        ids = sp.encode(words) if words else []
        unk_id = sp.unk_id()
        pieces = unk = 0.0
        for (w, c), seq in zip(top, ids):
            pieces += c * len(seq)
            if unk_id in seq:
                unk += c
        out["pieces_per_word"] = pieces / total
        out["unk_rate"] = unk / total
        tokens = {sp.id_to_piece(i) for i in range(sp.get_piece_size())}
    if len(true_counts) > EVAL_MAX_WORDS:
        out["evaluated_over_top_words"] = EVAL_MAX_WORDS
    return {"figures": out, "tokens": tokens}


#: At most this share of a public-extended vocabulary's tokens are whole words of the private histogram.
PRIVATE_WORD_SHARE = 0.5


def _as_corpus(source: FederatedCorpus | str, fmt: str | None, options: dict | None) -> FederatedCorpus:
    """``source`` itself, or the corpus its path or spec opens."""
    if isinstance(source, FederatedCorpus):
        return source
    from fedpriv.data.sources import open_corpus, split_format

    fmt, options = split_format(fmt, options or {})
    return open_corpus(str(source), format=fmt, **options)


def _public_counts(public: FederatedCorpus | str, fmt: str | None, options: dict | None, lowercase: bool) -> tuple[str, Counter]:
    """(name, plain word counts) of a public corpus."""
    corpus = _as_corpus(public, fmt, options)
    counter = WordCounter()
    for batch in corpus_word_batches(corpus):
        counter.add_many([[w.lower() for w in words] for words in batch] if lowercase else batch)
    counts = counter.finish()
    if not counts:
        raise EmptyCorpusError(f"{corpus.name}: the public corpus has no words")
    return corpus.name, counts


def _learn_public_extended(
    public_counts: Counter, private_counts: dict[str, float], size: int, folder: Path, min_pair_count: float, alphabet: str, true_counts: Counter
) -> tuple[Any, list[str], dict]:
    """A WordPiece vocabulary learned from the public counts, extended by whole words of the
    private (DP) counts (see :func:`build_vocab`), saved into ``folder``; (vocab, files, report
    figures: words added, and the coverage of the public-only and the histogram-only vocabularies
    of ``size`` tokens on the raw private words)."""
    from fedpriv.vocab.wordpiece import extend_wordpiece, learn_wordpiece

    public_only = learn_wordpiece(public_counts, size, min_pair_count=min_pair_count, alphabet=alphabet)
    missing = sum(1 for w, c in private_counts.items() if c > 0 and w not in public_only)  # words that need a slot
    base = learn_wordpiece(public_counts, size - min(missing, int(size * PRIVATE_WORD_SHARE)), min_pair_count=min_pair_count, alphabet=alphabet)
    vocab, added = extend_wordpiece(base, private_counts, size)
    vocab.save(folder / "vocab.txt")
    out = {"distinct_words": len(public_counts), "base_tokens": len(base), "words_added": len(added),
           "public_only": _figures("wordpiece", public_only, true_counts)["figures"]}
    if private_counts:
        private_only = learn_wordpiece(private_counts, size, min_pair_count=min_pair_count, alphabet=alphabet)
        out["histogram_only"] = _figures("wordpiece", private_only, true_counts)["figures"]
    return vocab, ["vocab.txt"], out


#: How the histogram's noise was drawn, for the report (never the seed itself).
SECRET_NOISE = "secret: numpy generator seeded from the OS CSPRNG (128 bits), never stored; the noise cannot be recomputed"
SEEDED_NOISE = "reproducible (simulation only): numpy default_rng(seed) of a seed given by the caller (not stored here); anyone with the seed can recompute and remove the noise"


def secret_generator() -> Any:
    """A numpy generator seeded with 128 bits from the OS's CSPRNG (``secrets``), never stored."""
    import secrets

    import numpy as np

    return np.random.default_rng(secrets.randbits(128))


def build_vocab(
    source: FederatedCorpus | str,
    kind: str = "word",
    size: int = 10_000,
    dp: str | None = None,
    *,
    out_dir: str | os.PathLike[str],
    epsilon: float | None = None,
    sigma: float | None = None,
    delta: float = 1e-9,
    tuple_size: int = DEFAULT_TUPLE_SIZE,
    partition: str = "stream",
    threshold_rule: str = "quantile",
    seed: int | None = 0,
    model_type: str = "unigram",
    min_pair_count: float = 2.0,
    source_format: str | None = None,
    source_options: dict | None = None,
    lowercase: bool = False,
    alphabet: str = "data",
    public: FederatedCorpus | str | None = None,
    public_format: str | None = None,
    public_options: dict | None = None,
) -> dict:
    """Build a vocabulary of ``kind`` with at most ``size`` entries (see the module doc) and return the report.

    ``dp``: None (plain), ``"gaussian"`` (Hoory et al. tuples; ``tuple_size`` words per tuple,
    ``partition`` stream, example or user: one tuple per user), ``"laplace"`` (``epsilon`` per word) or ``"count"``
    (Ponomareva et al.; ``tuple_size`` words per example). Give ``sigma`` or a target ``epsilon``
    for the Gaussian forms. ``lowercase``: words are lowercased before counting (for uncased BERT
    tokenizers). ``alphabet``: ``"ascii"`` puts every printable ASCII character (lowercased with
    ``lowercase``) into a WordPiece vocabulary whatever the data (public, so free); ``"data"``
    learns the characters from the histogram. ``public``: a public corpus (WordPiece only); the
    vocabulary is then a WordPiece vocabulary learned from the public corpus alone, extended by
    whole-word tokens for the most frequent words of the (DP, with ``dp``) histogram of ``source``
    that it lacks (at most ``PRIVATE_WORD_SHARE`` of ``size``): the public part costs no privacy,
    and the guarantee is the histogram's. The report then also gives the coverage of the public
    vocabulary alone and of the vocabulary learned from the histogram alone. All parameters are
    checked before the source is opened."""
    if kind not in KINDS:
        raise FedprivError(f"kind must be one of {', '.join(KINDS)}, got {kind!r}")
    size = _check_size(kind, size)
    chars = public_alphabet(alphabet, lowercase)
    if chars and kind != "wordpiece":
        raise FedprivError(f"alphabet = {alphabet!r} applies to WordPiece vocabularies, not {kind}")
    if public is not None and kind != "wordpiece":
        raise FedprivError(f"a public corpus extends WordPiece vocabularies, not {kind}")
    if kind == "sentencepiece":
        from fedpriv.vocab.spm import MODEL_TYPES

        if model_type not in MODEL_TYPES:
            raise FedprivError(f"model_type must be one of {', '.join(MODEL_TYPES)}, got {model_type!r}")
    params = None
    if dp is None:
        if epsilon is not None or sigma is not None:
            raise PrivacyParameterError("epsilon/sigma given without a DP mechanism; pass dp= one of " + ", ".join(MECHANISMS))
    else:
        if dp not in MECHANISMS:
            raise PrivacyParameterError(f"dp mechanism must be one of {', '.join(MECHANISMS)}, got {dp!r}")
        params = mechanism_params(
            dp, sigma=sigma, epsilon=epsilon, delta=delta, tuple_size=tuple_size, partition=partition, threshold_rule=threshold_rule
        )
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise FedprivError(f"{out}: exists and is not a directory")

    corpus = _as_corpus(source, source_format, source_options)

    # One pass: the plain histogram and the mechanism's.
    plain = WordCounter()
    mech = counter_for(params) if params is not None else None
    longest = 0
    for batch in corpus_word_batches(corpus):  # one user at a time
        if lowercase:
            batch = [[w.lower() for w in words] for words in batch]
        longest = max(longest, max(len(words) for words in batch))
        plain.add_many(batch)
        if isinstance(mech, UserCounter):
            mech.add_user(batch)  # the batch is one user's examples: one tuple
        elif mech is not None:
            mech.add_many(batch)
    true_counts = plain.finish()
    if not true_counts:
        raise EmptyCorpusError(f"{corpus.name}: the source has no words")
    public_name, public_counts = _public_counts(public, public_format, public_options, lowercase) if public is not None else (None, None)

    report: dict[str, Any] = {
        "source": corpus.name,
        "kind": kind,
        "size": size,
        "model_type": model_type if kind == "sentencepiece" else None,
        "noise": (SECRET_NOISE if seed is None else SEEDED_NOISE) if params is not None else None,
        "examples": plain.units,
        "word_occurrences": plain.words,
        "distinct_words": len(true_counts),
        "longest_example_words": longest,
        "lowercase": bool(lowercase),
        "alphabet": alphabet,
    }
    hist = None
    if params is not None:
        hist = release(mech.finish(), params, secret_generator() if seed is None else seed, mech.units)
        if hist.words_kept == 0 and public_counts is None:
            raise EmptyCorpusError(
                f"the DP histogram kept no word: all {hist.words_before:,} words fell below the threshold "
                f"C = {hist.threshold:.6g} (noise {params.noise_name} = {params.noise:.6g}, {hist.units:,} {params.unit}s); "
                "use less noise (larger epsilon or delta), a smaller tuple size, or a bigger source"
            )

    target = out.resolve()
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.staging-", dir=target.parent))
    try:
        counts = hist.counts if hist is not None else dict(true_counts)
        if public_counts is None:
            vocab, files = _learn(kind, counts, size, staging, model_type, min_pair_count, chars)
        else:
            vocab, files, public_report = _learn_public_extended(public_counts, counts, size, staging, min_pair_count, chars, true_counts)
            report["public"] = {"source": public_name, **public_report}
        ev = _figures(kind, vocab, true_counts)
        report["vocabulary"] = {**ev["figures"], "files": files}
        if hist is not None:
            from fedpriv.vocab.spm import write_counts_tsv

            write_counts_tsv(hist.counts, staging / "histogram.tsv")
            files = [*files, "histogram.tsv"]
            report["vocabulary"]["files"] = files
            d = hist.to_dict()
            report["dp"] = d
            for k in ("epsilon", "delta", "threshold", "words_before", "words_kept", "words_dropped"):
                report[k] = d[k]
            report[params.noise_name] = params.noise
            with tempfile.TemporaryDirectory(prefix="fedpriv-nonprivate-") as private:  # never kept
                base, _ = _learn(kind, dict(true_counts), size, Path(private), model_type, min_pair_count, chars)
                bev = _figures(kind, base, true_counts)
            overlap = len(ev["tokens"] & bev["tokens"]) / max(1, len(bev["tokens"]))
            report["non_private"] = {"words": len(true_counts), **bev["figures"], "token_overlap_with_dp": overlap}
            report["guarantee"] = hist.guarantee
        else:
            report["dp"] = None
            report["guarantee"] = "none: the vocabulary is learned from the raw histogram (not differentially private)"
        report["note"] = NOT_PRIVATE_NOTE
        report["out_dir"] = str(out)
        report["files"] = [*files, "report.json"]
        (staging / "report.json").write_text(json.dumps(_jsonable(report), indent=2) + "\n", encoding="utf-8")
        out.mkdir(parents=True, exist_ok=True)
        for name in report["files"]:  # report.json last
            os.replace(staging / name, out / name)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return _jsonable(report)


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if hasattr(obj, "item") and not isinstance(obj, (str, bytes)):
        return obj.item()
    return obj
