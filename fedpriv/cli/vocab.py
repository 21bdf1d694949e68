"""``fedpriv vocab build``: a word, WordPiece or SentencePiece vocabulary, plain or from a DP histogram."""

from __future__ import annotations

import json
import sys
from enum import Enum
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

vocab_app = typer.Typer(help="Vocabularies: word, WordPiece, SentencePiece; plain or differentially private.", no_args_is_help=True)
_out = Console()


class Kind(str, Enum):
    word = "word"
    wordpiece = "wordpiece"
    sentencepiece = "sentencepiece"


class Mechanism(str, Enum):
    gaussian = "gaussian"
    laplace = "laplace"
    count = "count"


class Partition(str, Enum):
    stream = "stream"
    example = "example"
    user = "user"


class Rule(str, Enum):
    quantile = "quantile"
    paper = "paper"


class Alphabet(str, Enum):
    data = "data"
    ascii = "ascii"


class ModelType(str, Enum):
    unigram = "unigram"
    bpe = "bpe"


DP_HELP = (
    "gaussian: Hoory et al. 2021 (N-word tuples, each distinct word once per tuple; protects one tuple); "
    "laplace: Hoory et al. v1 (each distinct word once per example; --epsilon is per word, x N per example); "
    "count: Ponomareva et al. 2022 DP-SentencePiece (word counts of an example's first N words; protects one example)."
)


@vocab_app.command("build")
def build(
    source: str = typer.Argument(..., help="'shakespeare' (bundled), a path, or a 'synthetic:...' spec."),
    kind: Kind = typer.Option(Kind.word, "--kind", help="word (top-K words), wordpiece (BERT vocab.txt) or sentencepiece."),
    size: int = typer.Option(..., "--size", help="Vocabulary size: K words (word), tokens in all (wordpiece), at most this many pieces (sentencepiece)."),
    dp: Optional[Mechanism] = typer.Option(None, "--dp", help=DP_HELP),
    epsilon: Optional[float] = typer.Option(None, "--epsilon", help="Target epsilon (gaussian, count: < 1; sigma follows) or the per-word epsilon (laplace)."),
    sigma: Optional[float] = typer.Option(None, "--sigma", help="Gaussian noise std in counts (gaussian, count), instead of --epsilon."),
    delta: float = typer.Option(1e-9, "--delta", help="delta (per word for laplace); default 1e-9 as in Hoory et al."),
    tuple_size: int = typer.Option(256, "--tuple-size", help="N: words per tuple (gaussian), distinct words (laplace) or words (count) counted per example."),
    partition: Partition = typer.Option(Partition.stream, "--partition", help="gaussian: cut tuples from the concatenated stream (the paper), per example, or one per user (its N most frequent distinct words; protects one user)."),
    threshold_rule: Rule = typer.Option(Rule.quantile, "--threshold-rule", help="quantile: sound Gaussian quantile; paper: the printed erfinv formula (weaker delta, reported)."),
    model_type: ModelType = typer.Option(ModelType.unigram, "--model-type", help="SentencePiece model type."),
    seed: Optional[int] = typer.Option(None, "--seed", help="Reproducible DP noise from this seed, for simulations only (anyone with the seed can remove the noise; never stored). Default: secret noise from the OS CSPRNG."),
    lowercase: bool = typer.Option(False, "--lowercase", help="Lowercase words before counting (uncased BERT)."),
    alphabet: Alphabet = typer.Option(Alphabet.data, "--alphabet", help="wordpiece: 'ascii' always holds every printable ASCII character (public, no privacy cost); 'data' learns the characters from the histogram."),
    out: str = typer.Option(..., "--out", help="Output folder (vocabulary files and report.json, written atomically): new, empty, or one vocab build wrote; never a run directory."),
    force: bool = typer.Option(False, "--force", help="Write into a non-empty folder that vocab build did not write (its files of the same names are replaced)."),
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON."),
    format: Optional[str] = typer.Option(None, "--format", help="Override the format guessed from the path."),
    option: list[str] = typer.Option([], "--option", "-o", help="Loader option KEY=VALUE (repeatable), e.g. users=sentences:10."),
    public: Optional[str] = typer.Option(None, "--public", help="wordpiece: a public corpus; learn the vocabulary from it and extend it by the most frequent words of SOURCE's (DP) histogram (the public part costs no privacy)."),
    public_option: list[str] = typer.Option([], "--public-option", help="Loader option KEY=VALUE of --public (repeatable)."),
) -> None:
    """Build a vocabulary and print what it kept, what DP cost, and the guarantee."""
    from fedpriv.cli.options import parse_options
    from fedpriv.errors import FedprivError
    from fedpriv.rundir import claim
    from fedpriv.vocab.build import build_vocab

    if not out.strip():
        raise FedprivError("--out '': an empty path names no folder (it would write into the current directory); give a folder")
    claim(out, "vocab", force, create=False)  # never a run directory or store, nor the user's own folder
    if seed is not None and dp is not None:
        from fedpriv.cli.privatize import SEED_WARNING

        print(SEED_WARNING, file=sys.stderr, flush=True)
    report = build_vocab(
        source,
        kind.value,
        size,
        dp.value if dp is not None else None,
        out_dir=out,
        epsilon=epsilon,
        sigma=sigma,
        delta=delta,
        tuple_size=tuple_size,
        partition=partition.value,
        threshold_rule=threshold_rule.value,
        seed=seed,
        model_type=model_type.value,
        source_format=format,
        source_options=parse_options(option),
        lowercase=lowercase,
        alphabet=alphabet.value,
        public=public,
        public_options=parse_options(public_option),
    )
    claim(out, "vocab", force=True)  # marked: a later vocab build may replace what this one wrote
    if as_json:
        print(json.dumps(report, indent=2))
        return
    print_report(report)


def _fmt(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return str(v)
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, float):
        return f"{v:.4g}" if abs(v) < 1e5 else f"{v:,.0f}"
    return str(v)


def print_report(report: dict) -> None:
    """The report as a rich table: DP and non-private side by side."""
    dp = report.get("dp")
    title = f"{report['kind']} vocabulary of {report['source']}" + (f" (DP: {dp['mechanism']})" if dp else "")
    t = Table(title=title)
    t.add_column("")
    t.add_column("DP" if dp else "vocabulary", justify="right")
    if dp:
        t.add_column("non-private", justify="right")
    np_ = report.get("non_private") or {}

    def row(name: str, v, w=None) -> None:
        t.add_row(name, _fmt(v), *([_fmt(w)] if dp else []))

    row("examples", report["examples"], report["examples"])
    row("word occurrences", report["word_occurrences"], report["word_occurrences"])
    if dp:
        row("unit protected", dp["unit"], "none")
        row("epsilon", dp["epsilon"], None)
        row("delta", dp["delta"], None)
        if dp["mechanism"] == "laplace":
            row("epsilon, delta per word", f"{dp['epsilon_per_word']:.4g}, {dp['delta_per_word']:.3g}", None)
            row("laplace scale", dp["laplace_scale"], None)
        else:
            row("sigma", dp["sigma"], None)
        row("threshold C", dp["threshold"], None)
        row("words kept", dp["words_kept"], np_.get("words"))
        row("words dropped", dp["words_dropped"], 0)
    else:
        row("distinct words", report["distinct_words"])
    voc = report["vocabulary"]
    for key, name in (("vocab_size", "vocabulary size"), ("oov_rate", "OOV rate (occurrences)"),
                      ("pieces_per_word", "pieces per word"), ("unk_rate", "UNK rate (occurrences)")):
        if key in voc:
            row(name, voc[key], np_.get(key))
    if dp:
        row("token overlap with non-private", np_.get("token_overlap_with_dp"), None)
    pub = report.get("public")
    if pub:
        row("public vocabulary tokens", pub["base_tokens"])
        row("private words added", pub["words_added"])
        for part, name in (("public_only", "public vocabulary alone"), ("histogram_only", "histogram vocabulary alone")):
            if part in pub:
                row(f"{name}: pieces per word", pub[part]["pieces_per_word"])
                row(f"{name}: UNK rate", pub[part]["unk_rate"])
    _out.print(t)
    _out.print(f"guarantee: {report['guarantee']}", markup=False, highlight=False, soft_wrap=True)
    _out.print(f"wrote {', '.join(report['files'])} to {report['out_dir']}", markup=False, highlight=False, soft_wrap=True)
    if dp:
        _out.print(f"note: {report['note']}", markup=False, highlight=False, soft_wrap=True)
