"""Canaries and the federated secret sharer (Thakkar et al. 2021; Carlini et al. 2019).

A canary is a sequence of ``k`` random in-vocabulary words (k = 5 by default), drawn uniformly or
by training-word frequency, distinct from every other canary and never occurring as a contiguous
k-gram in the training corpus. For the masked-LM audit a canary follows a hint/secret pattern of
Hoory et al. 2021 (S, HS, HSH, HHSHH): H a hint word, S the secret, drawn uniformly.

Planting (the federated secret sharer): for each configuration (p_u, p_e) there are
``per_config`` canaries; for each canary, every training user independently becomes a sharer with
probability p_u, and each of a sharer's examples is independently replaced by the canary with
probability p_e. Canaries are planted in manifest order and an example already replaced keeps
its first canary, so every recorded insertion is really in the data.

Scaling rule for small populations: Thakkar et al.'s p_u (1/50K, 3/50K, 1/5K) assume ~342K users.
With N users, every p_u is multiplied by one factor ``s = max(1, min_expected_sharers / (min p_u * N))``
(capped at p_u = 1), so the rarest configuration still expects ``min_expected_sharers`` sharers
and the ratios between configurations are kept. ``min_expected_sharers = 0`` never scales.

Everything is a pure function of (corpus, vocabulary, config, seed): the central and federated
runs of an experiment, and the audit, rebuild the same planted corpus and manifest.

The vocabulary is fixed before planting (built on the clean training users), as in Thakkar et
al., whose 10K vocabulary is precomputed; canary words are therefore in-vocabulary by construction.
"""

from __future__ import annotations

import itertools
import json
import os
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from fedpriv.config import CanariesConfig
from fedpriv.data.corpus import FederatedCorpus
from fedpriv.data.examples import Example, TaggedExample, TextExample
from fedpriv.data.stores import UserStore
from fedpriv.errors import DataFormatError, FedprivError
from fedpriv.jsonio import write_json_atomic
from fedpriv.rundir import CANARIES

CANARY_STREAM = 0xCA7A
_MAX_DRAWS = 1000


@dataclass(frozen=True)
class Canary:
    """One planted canary and what planting did with it."""

    id: str
    words: tuple[str, ...]
    user_probability: float  # p_u as configured
    example_probability: float  # p_e
    effective_user_probability: float  # p_u after the scaling rule
    pattern: str | None = None  # masked-LM canaries: e.g. "HSH"; None for plain k-word canaries
    sharers: tuple[str, ...] = ()  # user ids, in corpus order
    insertions: int = 0  # examples replaced by this canary
    insertions_by_sharer: tuple[int, ...] = ()  # aligned with sharers

    @property
    def text(self) -> str:
        return " ".join(self.words)

    @property
    def secret_index(self) -> int | None:
        return None if self.pattern is None else self.pattern.index("S")

    @property
    def configuration(self) -> str:
        return f"p_u={self.user_probability:.3g} p_e={self.example_probability:.3g}"

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["words"], d["sharers"], d["insertions_by_sharer"] = list(self.words), list(self.sharers), list(self.insertions_by_sharer)
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "Canary":
        return cls(**{**d, "words": tuple(d["words"]), "sharers": tuple(d["sharers"]), "insertions_by_sharer": tuple(d["insertions_by_sharer"])})


@dataclass
class Manifest:
    """The canaries of an experiment and where they went. ``replacements``: user id -> {example
    index -> canary index} (not saved: it is recomputed from the seed)."""

    canaries: list[Canary]
    seed: int
    population: int
    scale: float
    distribution: str
    replacements: dict[str, dict[int, int]] = field(default_factory=dict, repr=False)
    #: the words canaries were drawn from and their probabilities (the Random Sampling reference
    #: distribution); in memory only, recomputed with the planting.
    pool: list[str] = field(default_factory=list, repr=False)
    weights: np.ndarray | None = field(default=None, repr=False)

    @property
    def total_insertions(self) -> int:
        return sum(c.insertions for c in self.canaries)

    def to_json(self) -> dict[str, Any]:
        return {
            "seed": self.seed,
            "population": self.population,
            "scale": self.scale,
            "distribution": self.distribution,
            "rule": "federated secret sharer: each user a sharer w.p. p_u*scale, each of a sharer's examples replaced w.p. p_e",
            "canaries": [c.to_json() for c in self.canaries],
        }

    def save(self, run_dir: str | os.PathLike[str]) -> None:
        write_json_atomic(Path(run_dir) / CANARIES, self.to_json())

    @classmethod
    def load(cls, run_dir: str | os.PathLike[str]) -> "Manifest":
        path = Path(run_dir) / CANARIES
        try:
            d = json.loads(path.read_text())
            return cls([Canary.from_json(c) for c in d["canaries"]], d["seed"], d["population"], d["scale"], d["distribution"])
        except FileNotFoundError:
            raise FedprivError(f"{path}: no canary manifest (was the run trained with a [canaries] section?)") from None
        except (ValueError, KeyError, TypeError) as e:
            raise DataFormatError(path, None, f"not a canary manifest ({e})") from None


# ---- the word pool ------------------------------------------------------------------------------
def canary_word_pool(task: Any) -> list[str]:
    """Words a canary may use: the task vocabulary's in-vocabulary words. For WordPiece tasks, the
    whole-word pieces that tokenize to themselves as one piece (so a canary word is one token)."""
    vocab = getattr(task, "vocab", None)
    if vocab is None:
        raise FedprivError(f"task {task.name!r} has no vocabulary to draw canary words from")
    if hasattr(vocab, "word_ids"):  # WordPiece (PieceVocab)
        special = set(int(i) for i in vocab.special)
        return [t for i, t in enumerate(vocab.tokens) if i not in special and not t.startswith("##") and vocab.word_ids(t) == (i,)]
    words = getattr(vocab, "words", None)
    if words is None:
        raise FedprivError(f"task {task.name!r}: cannot list the vocabulary's words for canaries")
    return list(words)


def word_weights(pool: Sequence[str], corpus: FederatedCorpus, distribution: str) -> np.ndarray:
    """Probabilities over ``pool``: uniform, or proportional to each word's count in ``corpus``
    (add-one, so a pool word never seen still has a chance)."""
    if distribution == "uniform":
        return np.full(len(pool), 1.0 / len(pool))
    index = {w: i for i, w in enumerate(pool)}
    counts = np.ones(len(pool))
    for ex in corpus.records():
        for w in ex.words():
            i = index.get(w)
            if i is not None:
                counts[i] += 1
    return counts / counts.sum()


def occurring_sequences(corpus: FederatedCorpus, candidates: set[tuple[str, ...]]) -> set[tuple[str, ...]]:
    """Which of ``candidates`` (word tuples, length >= 2) occur contiguously in some example."""
    by_len: dict[int, set[tuple[str, ...]]] = {}
    for c in candidates:
        by_len.setdefault(len(c), set()).add(c)
    firsts = {c[0] for c in candidates}
    found: set[tuple[str, ...]] = set()
    for ex in corpus.records():
        words = ex.words()
        for i, w in enumerate(words):
            if w in firsts:
                for n, group in by_len.items():
                    t = tuple(words[i : i + n])
                    if t in group:
                        found.add(t)
    return found


# ---- drawing ------------------------------------------------------------------------------------
def configurations(cfg: CanariesConfig, task_kind: str) -> list[tuple[str | None, float, float]]:
    """(pattern, p_u, p_e) of every canary slot, in manifest order (``per_config`` of each)."""
    patterns: list[str | None] = list(cfg.patterns) if task_kind == "mlm" else [None]
    slots = []
    for pattern, pu, pe in itertools.product(patterns, cfg.user_probabilities, cfg.example_probabilities):
        slots.extend([(pattern, pu, pe)] * cfg.per_config)
    return slots


def draw_words(
    slots: Sequence[tuple[str | None, float, float]],
    k: int,
    pool: Sequence[str],
    weights: np.ndarray,
    corpus: FederatedCorpus,
    seed: int,
) -> list[tuple[str, ...]]:
    """The words of each slot's canary: k words (or the pattern's length: hints by ``weights``,
    the secret uniformly), distinct from each other and absent from the corpus."""
    rng = np.random.default_rng([seed, CANARY_STREAM, 0])
    uniform = np.full(len(pool), 1.0 / len(pool))

    def draw(pattern: str | None) -> tuple[str, ...]:
        if pattern is None:
            return tuple(pool[i] for i in rng.choice(len(pool), size=k, p=weights))
        return tuple(pool[rng.choice(len(pool), p=uniform if ch == "S" else weights)] for ch in pattern)

    out: list[tuple[str, ...] | None] = [None] * len(slots)
    for _attempt in range(_MAX_DRAWS):
        todo = [i for i, w in enumerate(out) if w is None]
        if not todo:
            return out  # type: ignore[return-value]
        taken = {w for w in out if w is not None}
        for i in todo:
            w = draw(slots[i][0])
            if w not in taken:
                out[i] = w
                taken.add(w)
        fresh = {out[i] for i in todo if out[i] is not None and len(out[i]) >= 2}
        for w in occurring_sequences(corpus, fresh):  # in the corpus already: draw again
            out[out.index(w)] = None
    raise FedprivError(f"could not draw {len(slots)} distinct canaries from a pool of {len(pool)} words; use fewer canaries or a larger vocabulary")


# ---- planting -----------------------------------------------------------------------------------
def scale_factor(cfg: CanariesConfig, population: int) -> float:
    """The scaling rule (see the module docstring)."""
    if cfg.min_expected_sharers <= 0:
        return 1.0
    return max(1.0, cfg.min_expected_sharers / (min(cfg.user_probabilities) * population))


def choose_insertions(counts: np.ndarray, probabilities: Sequence[tuple[float, float]], seed: int) -> tuple[list[np.ndarray], dict[int, dict[int, int]]]:
    """The secret sharer's draws. ``probabilities``: (effective p_u, p_e) per canary. Returns each
    canary's sharer indices and user index -> {example index -> canary index} (first canary wins)."""
    n = len(counts)
    sharers: list[np.ndarray] = []
    replaced: dict[int, dict[int, int]] = {}
    for c, (pu, pe) in enumerate(probabilities):
        users = np.flatnonzero(np.random.default_rng([seed, CANARY_STREAM, 1, c]).random(n) < pu)
        sharers.append(users)
        for u in users:
            hits = np.flatnonzero(np.random.default_rng([seed, CANARY_STREAM, 2, c, int(u)]).random(int(counts[u])) < pe)
            slot = replaced.setdefault(int(u), {})
            for i in hits:
                slot.setdefault(int(i), c)
    return sharers, replaced


class PlantedStore(UserStore):
    """A store whose examples are the base store's with some replaced by canaries."""

    def __init__(self, base: UserStore, replacements: dict[str, dict[int, Example]]):
        self.base, self.replacements = base, replacements
        self.kind = base.kind

    def user_ids(self) -> Sequence[str]:
        return self.base.user_ids()

    def examples(self, user_id: str) -> list[Example]:
        exs = self.base.examples(user_id)
        repl = self.replacements.get(user_id)
        if not repl:
            return exs
        return [repl.get(i, ex) for i, ex in enumerate(exs)]

    def counts(self) -> np.ndarray:
        return self.base.counts()


def canary_example(words: Sequence[str], like: Example) -> Example:
    """The canary as an example of ``like``'s kind (same timestamp; NER tags all ``O``)."""
    if isinstance(like, TaggedExample):
        return TaggedExample(tuple(words), ("O",) * len(words), like.timestamp)
    return TextExample(" ".join(words), like.timestamp)


def plant_canaries(
    corpus: FederatedCorpus,
    task: Any,
    cfg: CanariesConfig,
    seed: int,
    task_kind: str,
    log: Callable[[str], None] | None = None,
) -> tuple[FederatedCorpus, Manifest]:
    """Draw the canaries and plant them in ``corpus`` (see the module docstring)."""
    say = log or (lambda _m: None)
    pool = canary_word_pool(task)
    if len(pool) < cfg.words:
        raise FedprivError(f"the vocabulary has {len(pool)} usable words; canaries need at least {cfg.words}")
    slots = configurations(cfg, task_kind)
    weights = word_weights(pool, corpus, cfg.distribution)
    words = draw_words(slots, cfg.words, pool, weights, corpus, seed)
    counts = corpus.counts()
    scale = scale_factor(cfg, corpus.num_users)
    eff = [(min(1.0, pu * scale), pe) for _, pu, pe in slots]
    sharer_idx, replaced = choose_insertions(counts, eff, seed)
    users = corpus.user_ids
    per_canary: list[Counter] = [Counter() for _ in slots]
    by_id: dict[str, dict[int, int]] = {}
    for u, slot in replaced.items():
        by_id[users[u]] = slot
        for c in slot.values():
            per_canary[c][users[u]] += 1
    canaries = []
    for c, ((pattern, pu, pe), w) in enumerate(zip(slots, words)):
        sh = tuple(users[u] for u in sharer_idx[c])
        canaries.append(
            Canary(f"c{c:03d}", w, pu, pe, eff[c][0], pattern, sh, sum(per_canary[c].values()), tuple(per_canary[c][u] for u in sh))
        )
    examples: dict[str, dict[int, Example]] = {}
    for uid, slot in by_id.items():
        base = corpus.examples(uid)
        examples[uid] = {i: canary_example(words[c], base[i]) for i, c in slot.items()}
    manifest = Manifest(canaries, seed, corpus.num_users, scale, cfg.distribution, by_id, pool, weights)
    planted = FederatedCorpus(PlantedStore(corpus.store, examples), corpus.name, {**corpus.info, "canaries": len(canaries)})
    scaled = f" (p_u scaled x{scale:.3g} for {corpus.num_users} users)" if scale != 1.0 else ""
    say(f"planted {len(canaries)} canaries: {manifest.total_insertions} examples replaced across {len(by_id)} users{scaled}")
    return planted, manifest


def same_canaries(a: Manifest, b: Manifest) -> bool:
    """True when two manifests hold the same canaries, sharers and insertions."""
    return a.canaries == b.canaries
