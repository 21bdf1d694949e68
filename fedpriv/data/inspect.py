"""Statistics of a FederatedCorpus: users, examples, tokens, per-user counts, frequent words.

Per-user example counts come from the store (cheap, exact). Token and word statistics need the
examples; for a corpus too big to read whole, they are computed over a uniform sample of users
and the result says so (``token_stats_over_users``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import numpy as np

from fedpriv.data.corpus import FederatedCorpus

#: Above this many examples, token statistics default to a sample of users.
FULL_SCAN_MAX_EXAMPLES = 2_000_000
DEFAULT_SAMPLE_USERS = 1000


def count_histogram(counts: np.ndarray) -> list[dict]:
    """Per-user example counts in power-of-two bins: [1,1], [2,3], [4,7], ..."""
    if counts.size == 0:
        return []
    top = int(np.ceil(np.log2(counts.max() + 1)))
    out = []
    for b in range(top):
        lo, hi = 2**b, 2 ** (b + 1) - 1
        n = int(((counts >= lo) & (counts <= hi)).sum())
        out.append({"min": lo, "max": hi, "users": n})
    return out


def inspect_corpus(
    corpus: FederatedCorpus,
    top_words: int = 20,
    sample_users: int | None = None,
    seed: int = 0,
    progress: Callable[[int, int], None] | None = None,
) -> dict:
    """A JSON-ready dict of statistics. ``sample_users``: compute token stats over that many users
    (default: all users, or a sample of 1,000 when the corpus has over 2M examples)."""
    counts = corpus.counts()
    if sample_users is None and corpus.num_examples > FULL_SCAN_MAX_EXAMPLES:
        sample_users = DEFAULT_SAMPLE_USERS
    scanned = corpus if sample_users is None or sample_users >= corpus.num_users else corpus.sample_users(sample_users, seed)
    words: Counter = Counter()
    tags: Counter = Counter()
    tokens = 0
    scanned_examples = 0
    for i, (_, exs) in enumerate(scanned.users()):
        if corpus.kind == "text":  # one split and one count per user: the same counts, far fewer calls
            w = " ".join(ex.text for ex in exs).split()
            tokens += len(w)
            words.update(w)
        for ex in exs if corpus.kind == "tagged" else ():
            w = ex.words()
            tokens += len(w)
            words.update(w)
            tags.update(t[2:] for t in ex.tags if t.startswith(("B-", "S-", "U-")))  # entity starts
        scanned_examples += len(exs)
        if progress is not None:
            progress(i + 1, scanned.num_users)
    stats = {
        "source": corpus.name,
        "kind": corpus.kind,
        "users": corpus.num_users,
        "examples": corpus.num_examples,
        "examples_per_user": {
            "min": int(counts.min()),
            "median": float(np.median(counts)),
            "mean": float(counts.mean()),
            "max": int(counts.max()),
            "histogram": count_histogram(counts),
        },
        "token_stats_over_users": scanned.num_users,
        "token_stats_over_examples": scanned_examples,
        "tokens": tokens,
        "tokens_per_example": tokens / scanned_examples if scanned_examples else 0.0,
        "distinct_words": len(words),
        "top_words": [{"word": w, "count": c} for w, c in sorted(words.items(), key=lambda kv: (-kv[1], kv[0]))[:top_words]],
    }
    if scanned.num_users < corpus.num_users:
        stats["tokens_estimated_total"] = round(stats["tokens_per_example"] * corpus.num_examples)
    if corpus.kind == "tagged":
        stats["entities"] = dict(sorted(tags.items()))
    facts = {k: v for k, v in corpus.info.items() if k != "notes"}
    if facts:
        stats["load"] = facts
    if corpus.notes:
        stats["notes"] = corpus.notes
    return stats
