"""Privatize the words of a corpus's users, user by user: the one implementation behind
``fedpriv privatize`` (:mod:`fedpriv.privacy.local.cli`, which writes the result as JSON Lines) and
the ``[privatize]`` stage of the training pipeline (:func:`privatize_training_corpus`, which keeps
it in memory as a :class:`~fedpriv.data.corpus.FederatedCorpus`).

Keys: the stream ``privatize`` of :mod:`fedpriv.privacy.streams` (:func:`privatize_root`): user
number i (in the corpus's user order) privatizes with ``fold_in(fold_in(root, PRIVATIZE.id), i)``,
its token j (counting over its examples in order) with ``fold_in(that, j)``; a user's output
depends only on the root, its position and its own words, never on how users are batched. The
root is a secret key (:func:`fedpriv.privacy.streams.secret_root`) for a released corpus, or
``key(seed)`` for a simulation: anyone with that seed can recompute, and remove, the noise.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np

from fedpriv.data.examples import Example, TaggedExample, TextExample
from fedpriv.errors import FedprivError

KEY_SCHEME = "user i (corpus order) uses fold_in(fold_in(root, PRIVATIZE), i); its token j (over its examples in order) fold_in(that, j)"
#: How the root was drawn, for the record written beside the output (never the seed or the key).
SECRET_ROOT = "secret: drawn from the OS CSPRNG (os.urandom), never stored; the noise cannot be recomputed"
SEEDED_ROOT = "reproducible (simulation only): jax.random.key(seed) of a seed given by the caller (not stored here); anyone with the seed can recompute and remove the noise"
NOT_COVERED = "user ids, the number of examples per user, the number of words per example and timestamps are copied as they are"
NOT_COVERED_TAGGED = NOT_COVERED + "; NER tags are kept as they are (they are not privatized: where the entities are, and their types, leave the user)"


def new_stats() -> dict[str, int]:
    """Counters :func:`privatize_users` updates: users, examples, tokens (read), done (privatized),
    changed (output differs from input id), oov (inputs outside the embedding vocabulary)."""
    return {"users": 0, "examples": 0, "tokens": 0, "changed": 0, "oov": 0, "done": 0}


def privatize_root(seed: Any) -> Any:
    """The first key of the ``privatize`` stream: ``fold_in(root_key(seed), PRIVATIZE.id)``;
    ``seed`` an int (simulation) or a key (e.g. :func:`~fedpriv.privacy.streams.secret_root`).

    >>> import jax
    >>> from fedpriv.privacy.streams import PRIVATIZE
    >>> k = privatize_root(0)
    >>> bool((jax.random.key_data(k) == jax.random.key_data(jax.random.fold_in(jax.random.key(0), PRIVATIZE.id))).all())
    True
    """
    from fedpriv.privacy.streams import PRIVATIZE, stream_key

    return stream_key(seed, PRIVATIZE)


def _lookup(space: Any, casefold: bool) -> Callable[[list[str]], np.ndarray]:
    if not casefold:
        return space.ids
    # Tagged (NER) tokens keep their case; embedding vocabularies are lowercase: a word the space
    # lacks is looked up lowercased (the case itself is not output, so it does not leak).
    return lambda words: np.array([space.id(w) if w in space else space.id(w.lower()) for w in words], dtype=np.int64)


def _batched_users(
    users: Iterable[tuple[str, list[Example]]],
    ids_of: Callable[[list[str]], np.ndarray],
    apply: Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray],
    pad_id: int,
    batch_tokens: int,
    st: dict[str, int],
) -> Iterator[tuple[str, list[Example], np.ndarray, list[int]]]:
    """``(user_id, examples, ids, outputs)`` per user, in order: ``ids`` the user's word ids (over
    its examples in order), ``outputs`` = ``apply(streams, positions, ids)`` row for row (stream =
    the user's index, position = the token's index in the user). Users are batched,
    ``batch_tokens`` tokens per call (the last padded with ``pad_id``: one program shape); a row
    depends on its own (stream, position, id) only, so batching does not change the output."""
    if not 1 <= batch_tokens <= 65536:
        raise FedprivError("batch_tokens must be in [1, 65536]")
    pending: list[tuple[int, str, list[Example], np.ndarray]] = []
    pending_tokens = 0

    def flush() -> Iterator[tuple[str, list[Example], np.ndarray, np.ndarray]]:
        nonlocal pending, pending_tokens
        if not pending:
            return
        flat_streams = np.concatenate([np.full(ids.size, ui, np.uint32) for ui, _u, _e, ids in pending])
        flat_positions = np.concatenate([np.arange(ids.size, dtype=np.uint32) for *_x, ids in pending])
        flat_ids = np.concatenate([ids for *_x, ids in pending])
        chunks = []
        for s in range(0, flat_ids.size, batch_tokens):
            e = min(s + batch_tokens, flat_ids.size)
            pad = batch_tokens - (e - s)
            part = [np.concatenate([a[s:e], np.full(pad, fill, a.dtype)]) for a, fill in ((flat_streams, 0), (flat_positions, 0), (flat_ids, pad_id))]
            chunks.append(np.asarray(apply(*part))[: e - s])
        out = np.concatenate(chunks) if chunks else np.empty(0)
        st["done"] += int(flat_ids.size)
        batch, pending, pending_tokens = pending, [], 0
        at = 0
        for _ui, u, exs, ids in batch:
            yield u, exs, ids, out[at : at + ids.size]
            at += ids.size

    for ui, (u, exs) in enumerate(users):
        if ui >= 2**32:
            raise FedprivError("more than 2**32 users")
        ids = ids_of([w for ex in exs for w in ex.words()])
        pending.append((ui, u, exs, ids))
        pending_tokens += ids.size
        st["users"] += 1
        st["examples"] += len(exs)
        st["tokens"] += int(ids.size)
        if pending_tokens >= batch_tokens:
            yield from flush()
    yield from flush()


def _split_examples(exs: list[Example], rows: np.ndarray) -> list[np.ndarray]:
    """A user's per-token rows cut back into its examples (in order)."""
    out, at = [], 0
    for ex in exs:
        n = len(ex.words())
        out.append(rows[at : at + n])
        at += n
    return out


def privatize_users(
    users: Iterable[tuple[str, list[Example]]],
    space: Any,
    mechanism: str,
    eta: float,
    t: float | None = None,
    k: int = 2,
    seed: Any = 0,
    batch_tokens: int = 8192,
    casefold: bool = False,
    stats: dict[str, int] | None = None,
) -> Iterator[tuple[str, list[Example], list[list[str]]]]:
    """``(user_id, examples, new words of each example)`` for every user, in order.

    Each word becomes :func:`~fedpriv.privacy.local.mechanisms.privatize_streams`'s output
    (M_txt, or Vickrey with ``t`` and ``k``) on ``space`` (an
    :class:`~fedpriv.privacy.local.embeddings.EmbeddingSpace`); users are batched, ``batch_tokens``
    tokens per call (the last padded: one program shape), which does not change the output.
    ``casefold``: look a word the space lacks up lowercased (tagged corpora). ``stats`` (see
    :func:`new_stats`) is updated as users are read and privatized. Parameters are the caller's
    to check (:func:`fedpriv.privacy.local.mechanisms.check_text_mechanism`). ``seed``: an int
    (simulation) or a root key (:func:`~fedpriv.privacy.streams.secret_root` for a release); the
    keys are :func:`privatize_root`'s."""
    from fedpriv.privacy.local.mechanisms import privatize_streams

    st = stats if stats is not None else new_stats()
    index, root, words = space.index(), privatize_root(seed), space.words

    def apply(streams: np.ndarray, positions: np.ndarray, ids: np.ndarray) -> np.ndarray:
        return privatize_streams(root, streams, positions, ids, index, eta, mechanism, t, k)

    for u, exs, ids, new in _batched_users(users, _lookup(space, casefold), apply, space.oov_id, batch_tokens, st):
        st["changed"] += int(np.sum(new != ids))
        st["oov"] += int(np.sum(ids == space.oov_id))
        yield u, exs, [[words[i] for i in part] for part in _split_examples(exs, new)]


def represent_users(
    users: Iterable[tuple[str, list[Example]]],
    space: Any,
    eta: float,
    seed: Any = 0,
    batch_tokens: int = 8192,
    stats: dict[str, int] | None = None,
) -> Iterator[tuple[str, list[Example], list[np.ndarray]]]:
    """``(user_id, examples, M_rep vectors of each example)`` for every user, in order: each word's
    embedding plus noise with density ∝ exp(-eta·||N||) (float32, (words, dim) per example), with
    the same keys as :func:`privatize_users`, so M_txt of the same seed is the nearest word to
    each of these vectors. Words outside the space take its OOV row."""
    from fedpriv.privacy.local.mechanisms import privatize_stream_representations

    st = stats if stats is not None else new_stats()
    root = privatize_root(seed)

    def apply(streams: np.ndarray, positions: np.ndarray, ids: np.ndarray) -> np.ndarray:
        return privatize_stream_representations(root, streams, positions, ids, space.table, eta)

    for u, exs, ids, vectors in _batched_users(users, space.ids, apply, space.oov_id, batch_tokens, st):
        st["oov"] += int(np.sum(ids == space.oov_id))
        yield u, exs, _split_examples(exs, vectors)


def privatized_example(ex: Example, words: list[str]) -> Example:
    """``ex`` with its words replaced (a tagged example keeps its tags)."""
    if isinstance(ex, TaggedExample):
        return TaggedExample(tuple(words), ex.tags, ex.timestamp)
    return TextExample(" ".join(words), ex.timestamp)
