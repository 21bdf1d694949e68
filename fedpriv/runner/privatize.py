"""The ``[privatize]`` stage: a corpus's training users privatized with a trained run's (or a
GloVe file's) embeddings, before the task and its vocabulary are built (see
:func:`fedpriv.runner.prepare.load_training_corpora`). The mechanisms are
:mod:`fedpriv.privacy.local`; this module only binds them to an embedding space that may come
from a run directory (:mod:`fedpriv.runner.embeddings`)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from fedpriv.data.corpus import FederatedCorpus
from fedpriv.data.examples import Example
from fedpriv.data.stores import MemoryStore
from fedpriv.privacy.local.corpus import KEY_SCHEME, NOT_COVERED, NOT_COVERED_TAGGED, new_stats, privatize_users, privatized_example
from fedpriv.privacy.local.mechanisms import check_text_mechanism, guarantee_note
from fedpriv.runner.embeddings import load_embeddings


def privatize_training_corpus(corpus: Any, settings: Any, log: Callable[[str], None] | None = None) -> tuple[Any, dict[str, Any]]:
    """The training users of ``corpus`` with every word privatized (``settings``: a
    :class:`fedpriv.config.PrivatizeConfig` with its seed resolved, or anything with its
    attributes), in the same user order, with the same examples per user and words per example
    (tagged examples keep their tags); and the record of what was done (for ``privatize.json``).
    Held in memory."""
    say = log or (lambda _m: None)
    eta, t = check_text_mechanism(settings.mechanism, settings.eta, settings.t, settings.k)
    k = int(settings.k)
    t0 = time.perf_counter()
    space = load_embeddings(settings.embeddings, settings.max_words, say)
    say(
        f"privatizing the {corpus.num_users} training users' words with {settings.mechanism} at eta = {eta:g}"
        + (f", t = {t:g}, k = {k}" if t is not None else "")
        + f" (seed {settings.seed}; embeddings {space.source}: {len(space):,} x {space.dim}, {space.allowed.size:,} output words)"
    )
    tagged = corpus.kind == "tagged"
    stats = new_stats()
    users: dict[str, list[Example]] = {}
    for u, exs, new in privatize_users(corpus.users(), space, settings.mechanism, eta, t, k, int(settings.seed), casefold=tagged, stats=stats):
        users[u] = [privatized_example(ex, words) for ex, words in zip(exs, new)]
    order = list(corpus.user_ids)
    out = FederatedCorpus(MemoryStore(users, corpus.kind), corpus.name).subset(order, name=f"{corpus.name}[privatized {settings.mechanism} eta={eta:g}]")
    seconds = time.perf_counter() - t0
    changed = stats["changed"] / max(1, stats["tokens"])
    say(f"privatized {stats['tokens']:,} tokens in {seconds:.1f} s: {changed:.1%} changed, {stats['oov']:,} outside the embedding vocabulary")
    record = {
        "mechanism": settings.mechanism,
        "eta": eta,
        "t": t,
        "k": k if settings.mechanism == "vickrey" else None,
        "seed": int(settings.seed),
        "embeddings": {"spec": str(settings.embeddings), **space.describe()},
        "guarantee": guarantee_note(eta, settings.mechanism),
        "keys": KEY_SCHEME,
        "privatized": "the training users' words (after the held-out split and user filters); evaluation data is the original text",
        "not_covered": NOT_COVERED_TAGGED if tagged else NOT_COVERED,
        "users": stats["users"],
        "examples": stats["examples"],
        "tokens": stats["tokens"],
        # Measured on the raw text (the training simulation holds it anyway); not part of the guarantee.
        "raw_text_statistics": {"changed_fraction": changed, "oov_inputs": stats["oov"]},
        "seconds": seconds,
    }
    return out, record
