"""Synthetic non-IID users, generated lazily: a stand-in for Stack Overflow's population.

Model (all draws deterministic by ``seed``):

* a Zipfian vocabulary of ``vocab_size`` pronounceable words (lowercase letters only; word id
  ``r`` is the ``r``-th most frequent word overall, short words are frequent);
* ``topics`` topics: each is the same Zipf law over ranks, mapped to words by a topic-specific
  permutation. The ``function_words`` most frequent ranks map to the same words in every topic;
  the rest are re-ordered per topic (log-rank plus Gaussian noise of std ``topic_jitter``, so a
  topic's head words are mostly mid-frequency words overall);
* per-user example counts: lognormal(sigma=``count_sigma``) weights, rescaled so every user has
  at least one example and the counts sum to ``examples`` exactly;
* each user: a Dirichlet(``topic_concentration``) topic mixture (small => non-IID), and
  ``favourite_words`` words (drawn from the user's main topic) that replace each token with
  probability ``favourite_rate``;
* each example (one sentence): a topic from the user's mixture, a length from a gamma law of
  mean ``sentence_mean`` and std ``sentence_std`` tokens (at least 1), and words from the topic;
  timestamps are non-decreasing whole epoch seconds inside a per-user window within
  2008-08-01 .. 2019-12-31 (UTC).

A user's examples come from an RNG seeded by ``(seed, user index)`` only, so any user can be built
alone and the result does not depend on which users were built before.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fedpriv.data.corpus import FederatedCorpus
from fedpriv.data.examples import TextExample
from fedpriv.data.stores import UserStore
from fedpriv.errors import SourceError

_CONSONANTS = "bdfgklmnprstvz"
_VOWELS = "aeiou"
_SYLLABLES = tuple(c + v for c in _CONSONANTS for v in _VOWELS)  # 70 two-letter syllables

_T_START = 1217548800.0  # 2008-08-01T00:00:00Z (Stack Overflow's launch)
_T_END = 1577836799.0  # 2019-12-31T23:59:59Z

# Independent RNG streams derived from the seed: SeedSequence([seed, stream, ...]).
_STREAM_COUNTS = 0
_STREAM_TOPICS = 1
_STREAM_USER = 2


@dataclass(frozen=True)
class SyntheticConfig:
    """Parameters of a synthetic population. Lengths are in tokens, rates are per token."""

    users: int
    examples: int  # total over all users (exact)
    seed: int = 0
    vocab_size: int = 20000
    function_words: int = 100  # most frequent ranks, shared by all topics
    topics: int = 50
    topic_concentration: float = 0.1  # Dirichlet alpha per topic; small => users stick to few topics
    topic_jitter: float = 2.5  # std of the noise added to log-rank when permuting a topic's ranks
    zipf_exponent: float = 1.0  # P(rank r) ~ (r + 1) ** -zipf_exponent
    sentence_mean: float = 13.0  # mean tokens per example
    sentence_std: float = 7.0  # std of tokens per example
    favourite_words: int = 5  # per-user favourite words
    favourite_rate: float = 0.02  # probability a token is replaced by a favourite word
    count_sigma: float = 2.0  # lognormal sigma of per-user example counts (heavy tail)

    def __post_init__(self) -> None:
        def bad(key: str, why: str) -> SourceError:
            return SourceError(f"synthetic: {key} {why}, got {getattr(self, key)!r}")

        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if f.type == "int" and (isinstance(v, bool) or not isinstance(v, (int, np.integer))):
                raise bad(f.name, "must be an integer")
            if f.type == "float" and (isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating))):
                raise bad(f.name, "must be a number")
            if f.type == "float" and not np.isfinite(v):
                raise bad(f.name, "must be finite")
        for key in ("users", "examples", "vocab_size", "topics", "topic_concentration", "zipf_exponent", "sentence_mean"):
            if getattr(self, key) <= 0:
                raise bad(key, "must be positive")
        for key in ("seed", "function_words", "topic_jitter", "sentence_std", "favourite_words", "count_sigma"):
            if getattr(self, key) < 0:
                raise bad(key, "must be >= 0")
        if self.examples < self.users:
            raise bad("examples", f"must be >= users ({self.users}) so that every user has one")
        if self.function_words >= self.vocab_size:
            raise bad("function_words", f"must be < vocab_size ({self.vocab_size})")
        if not 0.0 <= self.favourite_rate <= 1.0:
            raise bad("favourite_rate", "must be in [0, 1]")
        if self.favourite_rate > 0 and self.favourite_words == 0:
            raise bad("favourite_words", "must be >= 1 when favourite_rate > 0")

    def spec(self) -> str:
        """The shortest spec string that :func:`parse_synthetic_spec` maps back to this config."""
        best: list[str] | None = None
        for name, preset in PRESETS.items():
            diff = [name] + _diff(self, preset)
            if best is None or len(diff) < len(best):
                best = diff
        plain = _diff(self, None)
        if best is None or len(plain) < len(best):
            best = plain
        return "synthetic:" + ",".join(best)


def _diff(cfg: SyntheticConfig, base: SyntheticConfig | None) -> list[str]:
    out = []
    for f in dataclasses.fields(cfg):
        v = getattr(cfg, f.name)
        ref = getattr(base, f.name) if base is not None else f.default
        if base is None and f.name in ("users", "examples") or v != ref:
            out.append(f"{f.name}={v!r}")
    return out


PRESETS: dict[str, SyntheticConfig] = {
    # The TFF Stack Overflow train split: 342,477 users, 135,818,730 examples (sentences).
    "stackoverflow": SyntheticConfig(users=342_477, examples=135_818_730),
    # Small enough for tests and demos.
    "small": SyntheticConfig(users=200, examples=20_000, vocab_size=5000, topics=20),
}

_FIELDS = {f.name: f for f in dataclasses.fields(SyntheticConfig)}


def parse_synthetic_spec(spec: str) -> SyntheticConfig:
    """``synthetic:stackoverflow``, ``synthetic:small,seed=3``, ``synthetic:users=1000,examples=50000``.

    Comma-separated items after ``synthetic:`` (the prefix is optional): at most one preset name
    and ``key=value`` overrides of :class:`SyntheticConfig` fields. Without a preset, ``users``
    and ``examples`` are required. Raises :class:`SourceError` naming the offending key.
    """
    body = spec.strip()
    if body.startswith("synthetic:"):
        body = body[len("synthetic:") :]
    elif body == "synthetic":
        body = ""
    where = f"synthetic spec {spec!r}"
    preset: str | None = None
    values: dict[str, object] = {}
    for item in (s.strip() for s in body.split(",")):
        if not item:
            continue
        if "=" not in item:
            if item not in PRESETS:
                raise SourceError(f"{where}: unknown preset or item {item!r} (presets: {', '.join(PRESETS)}; or key=value)")
            if preset is not None:
                raise SourceError(f"{where}: two presets ({preset!r}, {item!r})")
            preset = item
            continue
        key, _, raw = (p.strip() for p in item.partition("="))
        if key not in _FIELDS:
            raise SourceError(f"{where}: unknown key {key!r} (known: {', '.join(_FIELDS)})")
        if key in values:
            raise SourceError(f"{where}: key {key!r} given twice")
        values[key] = _parse_value(where, key, raw)
    if preset is not None:
        base = dataclasses.asdict(PRESETS[preset])
    else:
        missing = [k for k in ("users", "examples") if k not in values]
        if missing:
            raise SourceError(f"{where}: {missing[0]} is required unless a preset is named ({', '.join(PRESETS)})")
        base = {}
    base.update(values)
    try:
        return SyntheticConfig(**base)
    except SourceError as e:
        raise SourceError(f"{where}: {str(e).removeprefix('synthetic: ')}") from None


def _parse_value(where: str, key: str, raw: str) -> int | float:
    typ = _FIELDS[key].type
    try:
        if typ == "int":
            try:
                return int(raw)
            except ValueError:
                x = float(raw)  # accept 1e6
                if not x.is_integer():
                    raise
                return int(x)
        x = float(raw)
        if not np.isfinite(x):
            raise ValueError
        return x
    except ValueError:
        kind = "an integer" if typ == "int" else "a number"
        raise SourceError(f"{where}: {key} must be {kind}, got {raw!r}") from None


def make_word(rank: int) -> str:
    """The pronounceable word for ``rank`` (bijective base-70 over two-letter syllables, so distinct)."""
    n = rank + 1
    parts = []
    while n > 0:
        n -= 1
        n, d = divmod(n, len(_SYLLABLES))
        parts.append(_SYLLABLES[d])
    return "".join(reversed(parts))


def user_counts(cfg: SyntheticConfig) -> np.ndarray:
    """Examples per user (int64, length ``cfg.users``): each >= 1, summing to ``cfg.examples``.

    Lognormal weights; ``1 + floor`` of the weights' share of the ``examples - users`` spare
    examples, with the remainder going to the largest fractional parts (ties by index).
    """
    rng = np.random.default_rng([cfg.seed, _STREAM_COUNTS])
    w = rng.lognormal(0.0, cfg.count_sigma, size=cfg.users)
    spare = cfg.examples - cfg.users
    share = w * (spare / w.sum())
    base = np.floor(share).astype(np.int64)
    left = spare - int(base.sum())
    if left > 0:
        frac = share - base
        top = np.argsort(-frac, kind="stable")[:left]
        base[top] += 1
    elif left < 0:  # float rounding overshoot (never in practice): take from the largest
        top = np.argsort(-base, kind="stable")[: -left]
        base[top] -= 1
    counts = base + 1
    assert int(counts.sum()) == cfg.examples and counts.min() >= 1
    return counts


#: Bytes a synthetic store needs, measured with tracemalloc (numpy 2, CPython 3.11): per user (its
#: count and its id), per vocabulary word (the word three times, the CDFs; plus 4 per topic for
#: the topic tables), and per example of the user being generated (its text, timestamp and the
#: draws behind them: a fixed part plus a part per token of the mean sentence length).
BYTES_PER_USER = 100
BYTES_PER_WORD = 300
BYTES_PER_WORD_AND_TOPIC = 4
BYTES_PER_EXAMPLE = 200
BYTES_PER_EXAMPLE_TOKEN = 30


def memory_bytes() -> int | None:
    """This machine's memory in bytes (physical RAM, or a smaller cgroup limit); None if unknown."""
    try:
        total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return None
    for limit in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            text = Path(limit).read_text().strip()
        except OSError:
            continue
        if text.isdigit():
            total = min(total, int(text))
    return total


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024:
            return f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.3g} PiB"


def check_memory(cfg: SyntheticConfig, largest_user: int | None = None) -> None:
    """Refuse (SourceError, stating the estimate) a population this machine cannot hold: the
    store's tables plus the examples of its largest user (``largest_user`` examples; before the
    counts are drawn, the mean examples / users, a lower bound). Users are generated one at a
    time, so this is what the source needs at once, not what a consumer keeps of it."""
    memory = memory_bytes()
    if memory is None:
        return
    largest = largest_user if largest_user is not None else -(-cfg.examples // cfg.users)
    tables = cfg.users * BYTES_PER_USER + cfg.vocab_size * (BYTES_PER_WORD + BYTES_PER_WORD_AND_TOPIC * cfg.topics)
    user = largest * (BYTES_PER_EXAMPLE + BYTES_PER_EXAMPLE_TOKEN * cfg.sentence_mean)
    if tables + user > memory:
        which = "the largest user" if largest_user is not None else "an average user"
        raise SourceError(
            f"{cfg.spec()}: needs about {_size(tables + user)} of memory ({_size(tables)} for {cfg.users:,} users and {cfg.vocab_size:,} words x "
            f"{cfg.topics} topics, {_size(user)} to generate {which}'s {largest:,} examples); this machine has {_size(memory)}: "
            "lower users, examples or vocab_size"
        )


class SyntheticStore(UserStore):
    """Users ``u000000``, ``u000001``, ... whose examples are generated on demand (see module doc).

    Building the store costs the per-user counts (one int64 per user), the vocabulary and the
    topic tables (``topics x vocab_size`` int32); no user's examples are built until asked.
    """

    kind = "text"

    def __init__(self, config: SyntheticConfig):
        self.config = cfg = config
        check_memory(cfg)
        self._counts = user_counts(cfg)
        check_memory(cfg, int(self._counts.max()))
        self._counts.setflags(write=False)
        self._width = max(6, len(str(cfg.users - 1)))
        self._ids: tuple[str, ...] | None = None
        self.generated = 0  # number of user generations so far (for tests / diagnostics)

        V, F = cfg.vocab_size, cfg.function_words
        words = [make_word(r) for r in range(V)]
        self.vocabulary: tuple[str, ...] = tuple(words)
        self._word_sp = np.array([w + " " for w in words], dtype=object)
        self._word_nl = np.array([w + "\n" for w in words], dtype=object)

        p = np.arange(1, V + 1, dtype=np.float64) ** -cfg.zipf_exponent
        self._cdf = np.cumsum(p / p.sum())
        self._cdf[-1] = 1.0
        # CDF over the non-function ranks only (favourite words come from there).
        q = p[F:]
        self._tail_cdf = np.cumsum(q / q.sum())
        self._tail_cdf[-1] = 1.0

        rng = np.random.default_rng([cfg.seed, _STREAM_TOPICS])
        logr = np.log(np.arange(F + 1, V + 1, dtype=np.float64))
        perm = np.empty((cfg.topics, V), dtype=np.int32)
        perm[:, :F] = np.arange(F, dtype=np.int32)
        for t in range(cfg.topics):
            key = logr + rng.normal(0.0, cfg.topic_jitter, size=V - F) if cfg.topic_jitter > 0 else logr
            perm[t, F:] = F + np.argsort(key, kind="stable")
        self._perm = perm  # topic t's rank-r word is word id perm[t, r]

        a, b = cfg.sentence_mean, cfg.sentence_std
        self._gamma = (a * a / (b * b), b * b / a) if b > 0 else None  # (shape, scale)

    # ---- UserStore ----------------------------------------------------------------------------
    def user_ids(self) -> Sequence[str]:
        if self._ids is None:
            w = self._width
            self._ids = tuple(f"u{i:0{w}d}" for i in range(self.config.users))
        return self._ids

    def counts(self) -> np.ndarray:
        return self._counts

    def index_of(self, user_id: str) -> int:
        """The user's index (its position in :meth:`user_ids`); KeyError when not a user here."""
        if (
            isinstance(user_id, str)
            and len(user_id) == self._width + 1
            and user_id[0] == "u"
            and user_id[1:].isdigit()
            and user_id[1:].isascii()
        ):
            i = int(user_id[1:])
            if i < self.config.users:
                return i
        raise KeyError(user_id)

    def examples(self, user_id: str) -> list[TextExample]:
        return self.generate(self.index_of(user_id))

    # ---- generation ---------------------------------------------------------------------------
    def topic_mixture(self, index: int) -> np.ndarray:
        """User ``index``'s topic mixture (float64, sums to 1); the first draw of its RNG."""
        return self._user_rng(index).dirichlet(np.full(self.config.topics, self.config.topic_concentration))

    def _user_rng(self, index: int) -> np.random.Generator:
        return np.random.default_rng([self.config.seed, _STREAM_USER, index])

    def word_table(self) -> Sequence[str]:
        return self.vocabulary

    def word_ids(self, user_id: str) -> tuple[np.ndarray, np.ndarray]:
        """The words :meth:`generate` joins into the user's texts, as ids into :attr:`vocabulary`
        (int32, flat) and words per example (int64); no text is built."""
        self.generated += 1
        ids, lengths, _ = self._draw_words(self.index_of(user_id))
        return ids.astype(np.int32, copy=False), lengths

    def generate(self, index: int) -> list[TextExample]:
        """User ``index``'s examples, vectorized: one draw per quantity for all its sentences."""
        self.generated += 1
        ids, lengths, rng = self._draw_words(index)
        n = len(lengths)
        # Words carry their separator: ' ' inside a sentence, '\n' at its end; one join, one split.
        toks = self._word_sp[ids]
        ends = np.cumsum(lengths) - 1
        toks[ends] = self._word_nl[ids[ends]]
        texts = "".join(toks.tolist()).split("\n")
        texts.pop()  # the empty string after the final '\n'

        lo, hi = np.sort(rng.uniform(_T_START, _T_END, size=2))
        gaps = np.cumsum(rng.exponential(1.0, size=n + 1))
        times = np.floor(lo + (hi - lo) * (gaps[:-1] / gaps[-1])).tolist()
        return [TextExample(t, ts) for t, ts in zip(texts, times)]

    def _draw_words(self, index: int) -> tuple[np.ndarray, np.ndarray, np.random.Generator]:
        """``(word ids, words per example, the user's RNG after drawing them)``."""
        cfg = self.config
        n = int(self._counts[index])
        rng = self._user_rng(index)
        mix = rng.dirichlet(np.full(cfg.topics, cfg.topic_concentration))
        mix_cdf = np.cumsum(mix)
        mix_cdf[-1] = 1.0
        main = int(np.argmax(mix))
        fav = None
        if cfg.favourite_words > 0:
            fr = cfg.function_words + np.searchsorted(self._tail_cdf, rng.random(cfg.favourite_words), side="right")
            fav = self._perm[main, np.minimum(fr, cfg.vocab_size - 1)]

        topic = np.searchsorted(mix_cdf, rng.random(n), side="right")
        np.minimum(topic, cfg.topics - 1, out=topic)
        if self._gamma is None:
            lengths = np.full(n, max(1, int(round(cfg.sentence_mean))), dtype=np.int64)
        else:
            lengths = np.maximum(1, np.rint(rng.gamma(*self._gamma, size=n))).astype(np.int64)
        total = int(lengths.sum())

        ranks = np.searchsorted(self._cdf, rng.random(total), side="right")
        np.minimum(ranks, cfg.vocab_size - 1, out=ranks)
        ids = self._perm[np.repeat(topic, lengths), ranks]
        if fav is not None and cfg.favourite_rate > 0:
            hit = np.flatnonzero(rng.random(total) < cfg.favourite_rate)
            ids[hit] = fav[rng.integers(0, len(fav), size=len(hit))]
        return ids, lengths, rng


def load_synthetic(spec_or_config: str | SyntheticConfig) -> FederatedCorpus:
    """A lazy :class:`FederatedCorpus` over a :class:`SyntheticStore`, named by its canonical spec."""
    if isinstance(spec_or_config, SyntheticConfig):
        cfg = spec_or_config
    elif isinstance(spec_or_config, str):
        cfg = parse_synthetic_spec(spec_or_config)
    else:
        raise SourceError(f"synthetic: expected a spec string or SyntheticConfig, got {type(spec_or_config).__name__}")
    return FederatedCorpus(SyntheticStore(cfg), cfg.spec())
