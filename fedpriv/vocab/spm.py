"""DP-SentencePiece (Ponomareva et al. 2022): SentencePiece trained from a (noisy) word histogram.

The histogram is written as a ``word<TAB>count`` TSV (counts rounded to positive integers) and
SentencePiece (unigram or BPE) is trained on it with ``input_format="tsv"``: each line is one
"sentence" (a word) of the given frequency, so training sees only the histogram. Privacy comes
from the histogram (:mod:`fedpriv.vocab.dp_histogram`); the rest of SentencePiece is unmodified.
Everything runs offline; a model is trained in a staging folder and moved into place, so the
output folder never holds half a model.

Cost: sentencepiece 0.2.3's unigram trainer extracts its seed pieces from a suffix array over the
text the TSV stands for (each word repeated ``count`` times): time and memory grow with the *total*
count (about 1 s and 120 MB per million, measured). For unigram, a histogram whose total exceeds
``max_total_count`` (default 5 million) is therefore scaled down to that total before it is written
(relative frequencies kept up to rounding; every word keeps a count >= 1; post-processing, so a DP
histogram stays DP). BPE training does not depend on the total and is never scaled.

SentencePiece's built-in DP options (``enable_differential_privacy``,
``differential_privacy_noise_level``, ``differential_privacy_clipping_threshold``) are still
accepted by the installed sentencepiece 0.2.3, but it logs "deprecated and ignored" and trains on
the raw counts. :func:`builtin_dp_available` probes for that, and :func:`train_builtin_dp`
refuses to run where the options are ignored rather than return a non-private model.
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from fedpriv.errors import EmptyCorpusError, FedprivError

MODEL_TYPES = ("unigram", "bpe")
#: Unigram training's cost grows with the total count; histograms above this total are scaled down.
MAX_TOTAL_COUNT = 5_000_000


@dataclass(frozen=True)
class SentencePieceModel:
    """Paths of a trained model (``PREFIX.model``, ``PREFIX.vocab``) and its piece count."""

    model_path: Path
    vocab_path: Path
    vocab_size: int
    model_type: str
    count_scale: float = 1.0  # the factor the histogram's counts were multiplied by before training

    def processor(self):
        return load_sentencepiece(self.model_path)


def load_sentencepiece(path: str | os.PathLike[str]):
    """A ``sentencepiece.SentencePieceProcessor`` for a ``.model`` file."""
    import sentencepiece as spm

    try:
        return spm.SentencePieceProcessor(model_file=str(path))
    except (OSError, RuntimeError) as e:
        raise FedprivError(f"{path}: not a readable SentencePiece model ({e})") from None


def write_counts_tsv(counts: Mapping[str, float], path: str | os.PathLike[str], scale: float = 1.0) -> int:
    """Write ``word<TAB>count`` lines (``count * scale`` rounded to an int >= 1; counts <= 0 and words
    holding whitespace skipped), most frequent first, atomically. Returns the number of lines."""
    rows = []
    for w, c in counts.items():
        c = float(c)
        if c <= 0 or not w or any(ch.isspace() for ch in w):
            continue
        rows.append((w, max(1, int(round(c * scale)))))
    rows.sort(key=lambda r: (-r[1], r[0]))
    path = Path(path)
    tmp = path.with_name(path.name + ".partial")
    with open(tmp, "w", encoding="utf-8", newline="\n") as f:
        for w, c in rows:
            f.write(f"{w}\t{c}\n")
    os.replace(tmp, path)
    return len(rows)


def _train(tsv: Path, staging: Path, prefix: str, vocab_size: int, model_type: str, **options) -> None:
    import sentencepiece as spm

    try:
        spm.SentencePieceTrainer.train(
            input=str(tsv),
            input_format="tsv",
            model_prefix=str(staging / prefix),
            vocab_size=vocab_size,
            model_type=model_type,
            hard_vocab_limit=False,  # a small (DP) histogram may support fewer pieces: report, don't fail
            minloglevel=2,
            **options,
        )
    except RuntimeError as e:
        msg = str(e).split("] ", 1)[-1]
        raise FedprivError(f"sentencepiece ({model_type}, vocab_size {vocab_size}): {msg}") from None


def train_sentencepiece(
    counts_or_tsv: Mapping[str, float] | str | os.PathLike[str],
    out_dir: str | os.PathLike[str],
    *,
    vocab_size: int,
    model_type: str = "unigram",
    prefix: str = "spm",
    max_total_count: int | None = MAX_TOTAL_COUNT,
    **options,
) -> SentencePieceModel:
    """Train SentencePiece (``unigram`` or ``bpe``) from a word histogram (a mapping, or a TSV path).

    Writes ``out_dir/PREFIX.model`` and ``out_dir/PREFIX.vocab`` atomically (staged, then moved).
    ``vocab_size`` is an upper bound: a small histogram may give fewer pieces (see ``vocab_size``
    of the result). For unigram, a mapping whose total count exceeds ``max_total_count`` is scaled
    down to it (see the module doc; ``None`` never scales). Extra ``options`` go to
    ``SentencePieceTrainer.train``."""
    if model_type not in MODEL_TYPES:
        raise FedprivError(f"model_type must be one of {', '.join(MODEL_TYPES)}, got {model_type!r}")
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < 1:
        raise FedprivError(f"vocab_size must be an integer >= 1, got {vocab_size!r}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".spm-", dir=out))
    try:
        scale = 1.0
        if isinstance(counts_or_tsv, Mapping):
            tsv = staging / "counts.tsv"
            if model_type == "unigram" and max_total_count is not None:
                total = sum(float(c) for c in counts_or_tsv.values() if c > 0)
                if total > max_total_count:
                    scale = max_total_count / total
            if write_counts_tsv(counts_or_tsv, tsv, scale) == 0:
                raise EmptyCorpusError("the histogram has no word left to train SentencePiece on")
        else:
            tsv = Path(counts_or_tsv)
            if not tsv.is_file():
                raise FedprivError(f"{tsv}: no such TSV file")
        _train(tsv, staging, prefix, vocab_size, model_type, **options)
        model, vocab = out / f"{prefix}.model", out / f"{prefix}.vocab"
        size = load_sentencepiece(staging / f"{prefix}.model").get_piece_size()
        os.replace(staging / f"{prefix}.vocab", vocab)
        os.replace(staging / f"{prefix}.model", model)
        return SentencePieceModel(model, vocab, size, model_type, scale)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


@contextlib.contextmanager
def _stderr_to_devnull():
    """Silence fd 2 (sentencepiece's C++ warnings) for the duration."""
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


@functools.lru_cache(maxsize=1)
def builtin_dp_available() -> bool:
    """Whether the installed sentencepiece honours ``enable_differential_privacy``.

    Probe: train on a tiny TSV with zero noise and a clipping threshold above every count. Where
    the option works every word is clipped away and training fails; where it is ignored
    (sentencepiece 0.2.3: "deprecated and ignored") the model trains on the raw counts."""
    import sentencepiece as spm

    with tempfile.TemporaryDirectory(prefix="fedpriv-spm-probe-") as d:
        tsv = Path(d) / "probe.tsv"
        tsv.write_text("".join(f"{w}\t5\n" for w in ("alpha", "beta", "gamma", "delta", "epsilon")), encoding="utf-8")
        try:
            with _stderr_to_devnull():
                spm.SentencePieceTrainer.train(
                    input=str(tsv), input_format="tsv", model_prefix=str(Path(d) / "p"), vocab_size=30,
                    model_type="unigram", hard_vocab_limit=False, minloglevel=3,
                    enable_differential_privacy=True, differential_privacy_noise_level=0.0,
                    differential_privacy_clipping_threshold=1000,
                )
        except RuntimeError:
            return True  # every count was clipped: the option is honoured
        return False


def train_builtin_dp(
    true_counts: Mapping[str, int],
    out_dir: str | os.PathLike[str],
    *,
    vocab_size: int,
    noise_level: float,
    clipping_threshold: int,
    prefix: str = "spm-builtin-dp",
) -> SentencePieceModel:
    """Cross-check: SentencePiece's own DP (unigram), given the *true* per-example counts.

    Its noise is ``round(max(0, c + N(0, noise_level^2)))``, zeroed below ``clipping_threshold``
    (sentencepiece's AddDPNoise, unseeded). The raw-count TSV is written to a private temporary
    folder and deleted. Refused where the installed sentencepiece ignores the options."""
    if not builtin_dp_available():
        import sentencepiece as spm

        raise FedprivError(
            f"sentencepiece {spm.__version__} ignores enable_differential_privacy (deprecated there): its 'DP' model "
            "would be trained on the raw counts; use fedpriv's count histogram (dp='count') instead"
        )
    with tempfile.TemporaryDirectory(prefix="fedpriv-spm-raw-") as d:
        tsv = Path(d) / "raw.tsv"
        write_counts_tsv(true_counts, tsv)
        return train_sentencepiece(
            tsv, out_dir, vocab_size=vocab_size, model_type="unigram", prefix=prefix,
            enable_differential_privacy=True, differential_privacy_noise_level=float(noise_level),
            differential_privacy_clipping_threshold=int(clipping_threshold),
        )
