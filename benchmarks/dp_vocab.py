"""Benchmark: DP word histograms and vocabulary learning over a ~100-million-word synthetic corpus, streamed.

One pass over the corpus (users generated one at a time, never the whole corpus in memory) feeds
the plain word counter and the three mechanisms' counters (Gaussian tuples, Laplace distinct words,
per-example counts); each counter's time is measured on its own, as is the corpus generation.
Then each mechanism releases its noisy histogram, and WordPiece and SentencePiece are learned from
the Gaussian one. Prints words per second and the peak RSS (ru_maxrss). Not part of the test suite:

    .venv/bin/python benchmarks/dp_vocab.py                      # ~100M words (7.7M examples)
    .venv/bin/python benchmarks/dp_vocab.py --examples 400000    # a quick run (~5M words)
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import tempfile
import time
from pathlib import Path

from fedpriv.data.synthetic import load_synthetic
from fedpriv.vocab.dp_histogram import WordCounter, counter_for, mechanism_params, release


def peak_rss_mb() -> float:
    """Peak resident set size of this process in MB (ru_maxrss is KB on Linux, bytes on macOS)."""
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / (1024.0 * 1024.0) if sys.platform == "darwin" else rss / 1024.0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--users", type=int, default=100_000)
    ap.add_argument("--examples", type=int, default=7_700_000, help="7.7M examples of mean 13 words is ~100M words")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tuple-size", type=int, default=256)
    ap.add_argument("--delta", type=float, default=1e-9)
    ap.add_argument("--epsilon", type=float, default=0.5, help="Gaussian and count: target epsilon; Laplace: per word")
    ap.add_argument("--wordpiece-size", type=int, default=30_000)
    ap.add_argument("--spm-size", type=int, default=8_000)
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    args = ap.parse_args(argv)

    spec = f"synthetic:users={args.users},examples={args.examples},seed={args.seed}"
    corpus = load_synthetic(spec)
    params = {
        "gaussian": mechanism_params("gaussian", epsilon=args.epsilon, delta=args.delta, tuple_size=args.tuple_size),
        "laplace": mechanism_params("laplace", epsilon=args.epsilon, delta=args.delta, tuple_size=args.tuple_size),
        "count": mechanism_params("count", epsilon=args.epsilon, delta=args.delta, tuple_size=args.tuple_size),
    }
    counters = {"plain": WordCounter(), **{m: counter_for(p) for m, p in params.items()}}
    spent = dict.fromkeys(counters, 0.0)
    t_gen = 0.0
    t0 = time.perf_counter()
    for uid in corpus.user_ids:  # one user in memory at a time
        a = time.perf_counter()
        batch = [ex.words() for ex in corpus.store.examples(uid)]
        t_gen += time.perf_counter() - a
        for name, c in counters.items():
            a = time.perf_counter()
            c.add_many(batch)
            spent[name] += time.perf_counter() - a
    t_pass = time.perf_counter() - t0
    words = counters["plain"].words
    rss_after_count = peak_rss_mb()

    result: dict = {
        "spec": spec,
        "examples": counters["plain"].units,
        "words": words,
        "distinct_words": len(counters["plain"].counts),
        "pass_seconds": t_pass,
        "generate_and_split_seconds": t_gen,
        "generate_words_per_second": words / t_gen,
        "counting": {},
        "release": {},
    }
    for name, s in spent.items():
        result["counting"][name] = {"seconds": s, "words_per_second": words / s}
    hists = {}
    for m, p in params.items():
        c = counters[m]
        a = time.perf_counter()
        h = release(c.finish(), p, args.seed, c.units)
        s = time.perf_counter() - a
        hists[m] = h
        result["release"][m] = {
            "seconds": s, "epsilon": h.epsilon, "delta": h.delta, "threshold": h.threshold, "noise": h.noise,
            "units": h.units, "words_before": h.words_before, "words_kept": h.words_kept,
            "end_to_end_words_per_second": words / (t_gen + spent[m] + s),
        }

    from fedpriv.vocab.spm import train_sentencepiece
    from fedpriv.vocab.wordpiece import learn_wordpiece

    g = hists["gaussian"].counts
    a = time.perf_counter()
    wp = learn_wordpiece(g, args.wordpiece_size)
    result["wordpiece"] = {"seconds": time.perf_counter() - a, "vocab_size": len(wp), "from_words": len(g)}
    with tempfile.TemporaryDirectory() as d:
        a = time.perf_counter()
        m = train_sentencepiece(g, Path(d), vocab_size=args.spm_size, model_type="unigram")
        result["sentencepiece"] = {"seconds": time.perf_counter() - a, "vocab_size": m.vocab_size, "from_words": len(g)}
    result["peak_rss_mb_after_counting"] = rss_after_count
    result["peak_rss_mb"] = peak_rss_mb()

    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(f"{spec}: {result['examples']:,} examples, {words:,} words, {result['distinct_words']:,} distinct")
    print(f"one pass {t_pass:.1f} s; generating+splitting the corpus {t_gen:.1f} s ({words / t_gen / 1e6:.2f} M words/s)")
    for name, r in result["counting"].items():
        print(f"  count {name:<9} {r['seconds']:7.1f} s  {r['words_per_second'] / 1e6:6.2f} M words/s")
    for name, r in result["release"].items():
        print(f"  release {name:<9} {r['seconds']:5.2f} s  eps={r['epsilon']:.4g} delta={r['delta']:.3g} C={r['threshold']:.1f} "
              f"kept {r['words_kept']:,}/{r['words_before']:,}; end to end {r['end_to_end_words_per_second'] / 1e6:.2f} M words/s")
    print(f"  wordpiece {result['wordpiece']['vocab_size']:,} tokens in {result['wordpiece']['seconds']:.1f} s; "
          f"sentencepiece {result['sentencepiece']['vocab_size']:,} pieces in {result['sentencepiece']['seconds']:.1f} s")
    print(f"peak RSS {result['peak_rss_mb']:.0f} MB (after counting {rss_after_count:.0f} MB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
