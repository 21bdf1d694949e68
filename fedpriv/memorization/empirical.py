"""Empirical privacy: canaries included at random, scored after training, and a lower bound on
epsilon from their scores (one training run; Steinke et al. 2023).

``m`` audit canaries are drawn (random word sequences from the task's vocabulary), and each is
included in training independently with probability 1/2; the others are the non-members. What a
canary is depends on the unit the run's guarantee protects:

* ``example``: an included canary is one extra example of a training user picked at random
  (example-level DP-SGD protects one example);
* ``user``: an included canary is a new user whose whole data is the canary (user-level DP-SGD
  and DP-FedAvg protect one user);
* ``client`` (DP-FedAvg only; Andrew et al. 2024): an included canary is a client that holds no
  data and whose update is a fixed random direction of norm S; its score is the cosine between
  the run's final model delta and its direction.

A data canary's score is minus its loss (log-perplexity per token) under the trained model:
members should score higher. From the members' and non-members' scores jax-privacy's
``auditing.CanaryScoreAuditor`` gives the one-run lower bound on epsilon at the run's delta with
95% confidence (Steinke et al. 2023; its f-DP refinement, Mahloujifar et al. 2024), the GDP-based
estimate, the TPR at a low FPR and the AUROC. The lower bound holds for the unit the canaries
are (an example or a user); the accountant's epsilon is an upper bound for the same unit, so a
lower bound above it means a privacy bug (or an audit of the wrong unit).

Relation: every kind adds or removes its canary (a member is present, a non-member absent), so the
lower bound is for add-or-remove-one. Under Poisson sampling the accountant's epsilon is for the
same relation; under fixed-size sampling it is for replace-one, which does not bound
add-or-remove-one: :func:`audit_relations` says so, and the two are then reported, not compared.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from fedpriv.data.corpus import FederatedCorpus
from fedpriv.data.examples import Example, TextExample
from fedpriv.data.stores import MemoryStore
from fedpriv.errors import FedprivError
from fedpriv.jsonio import read_json, write_json_atomic
from fedpriv.memorization.canaries import canary_word_pool
from fedpriv.privacy.streams import AUDIT_CANARY, stream_key
from fedpriv.rundir import EMPIRICAL_CANARIES

EMPIRICAL_STREAM = AUDIT_CANARY.id
CANARY_USER_PREFIX = "__audit_canary__"
SIGNIFICANCE = 0.05
LOW_FPR = 0.01
KINDS = ("example", "user", "client")


@dataclass
class AuditCanaries:
    """The audit canaries of a run: words (data kinds) or a direction seed (client kind), which
    are members, and where the example-kind members went (user ids)."""

    kind: str
    seed: int
    included: np.ndarray  # (m,) bool
    words: list[list[str]] = field(default_factory=list)
    hosts: list[str | None] = field(default_factory=list)  # example kind: the user each member joined

    @property
    def count(self) -> int:
        return int(len(self.included))

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "seed": self.seed, "included": [bool(x) for x in self.included], "words": self.words, "hosts": self.hosts,
                "rule": "each canary included independently with probability 1/2; the others are non-members"}

    def save(self, run_dir: str | os.PathLike[str]) -> None:
        write_json_atomic(Path(run_dir) / EMPIRICAL_CANARIES, self.to_json())

    @classmethod
    def load(cls, run_dir: str | os.PathLike[str]) -> "AuditCanaries":
        path = Path(run_dir) / EMPIRICAL_CANARIES
        if not path.is_file():
            raise FedprivError(f"{run_dir}: no audit canaries ({EMPIRICAL_CANARIES}); train the run with [audit] empirical = true")
        d = read_json(path, "audit canary manifest")
        try:
            return cls(d["kind"], int(d["seed"]), np.asarray(d["included"], bool), [list(w) for w in d["words"]], list(d["hosts"]))
        except (KeyError, TypeError, ValueError) as e:
            raise FedprivError(f"{path}: not an audit canary manifest ({e})") from None


def draw_audit_canaries(task: Any, count: int, words: int, kind: str, seed: int) -> AuditCanaries:
    """``count`` canaries of ``kind``, each a member with probability 1/2 (deterministic by seed).
    Data kinds draw ``words`` words uniformly from the task's vocabulary per canary."""
    if kind not in KINDS:
        raise FedprivError(f"audit canaries: kind must be one of {', '.join(KINDS)}, got {kind!r}")
    rng = np.random.default_rng([seed, EMPIRICAL_STREAM])
    included = rng.random(count) < 0.5
    if kind == "client":
        return AuditCanaries(kind, seed, included)
    pool = canary_word_pool(task)
    if len(pool) < 2:
        raise FedprivError("audit canaries need a vocabulary of at least 2 words")
    drawn = [[pool[i] for i in rng.integers(0, len(pool), words)] for _ in range(count)]
    return AuditCanaries(kind, seed, included, drawn)


def plant_audit_canaries(corpus: FederatedCorpus, canaries: AuditCanaries) -> FederatedCorpus:
    """``corpus`` with the member canaries added: one extra example of a random user each
    (``example``), or one new user each, holding only its canary (``user``). Non-members are not
    added anywhere. The client kind plants nothing (the engines add its updates)."""
    if canaries.kind == "client":
        return corpus
    if corpus.kind != "text":
        raise FedprivError(f"audit canaries are text examples; {corpus.name} holds {corpus.kind} examples")
    users: dict[str, list[Example]] = {u: list(exs) for u, exs in corpus.users()}
    order = list(corpus.user_ids)
    rng = np.random.default_rng([canaries.seed, EMPIRICAL_STREAM, 1])
    hosts: list[str | None] = []
    for i, (member, words) in enumerate(zip(canaries.included, canaries.words)):
        if not member:
            hosts.append(None)
            continue
        example = TextExample(" ".join(words))
        if canaries.kind == "example":
            host = order[int(rng.integers(0, len(order)))]
            users[host].append(example)
        else:
            host = f"{CANARY_USER_PREFIX}{i}"
            users[host] = [example]
            order.append(host)
        hosts.append(host)
    canaries.hosts = hosts
    return FederatedCorpus(MemoryStore(users, corpus.kind), corpus.name).subset(order, name=f"{corpus.name}[+{int(canaries.included.sum())} audit canaries]")


def canary_scores(task: Any, params: Any, canaries: AuditCanaries, batch: int = 256) -> np.ndarray:
    """(m,) minus each data canary's loss under ``params`` (higher: more likely a member)."""
    examples = [TextExample(" ".join(w)) for w in canaries.words]
    losses = jax.jit(lambda p, b: task.losses(p, b, jax.random.key(0), False))
    out = []
    for start in range(0, len(examples), batch):
        chunk = examples[start : start + batch]
        enc = task.encode(chunk)
        pad = batch - len(chunk)
        enc = {k: np.concatenate([v, np.zeros((pad, *v.shape[1:]), v.dtype)]) for k, v in enc.items()}
        out.append(-np.asarray(losses(params, enc))[: len(chunk)])
    return np.concatenate(out)


def _key(seed: int, index: int | jax.Array) -> jax.Array:
    return jax.random.fold_in(_audit_stream(seed) if isinstance(seed, (int, np.integer)) else stream_key(seed, AUDIT_CANARY), index)


@functools.lru_cache(maxsize=16)
def _audit_stream(seed: int) -> jax.Array:
    """``stream_key(seed, AUDIT_CANARY)`` for an int seed, made once: a round of DP-FedAvg with
    canary clients asks for it once per sampled canary (three eager JAX ops each)."""
    return stream_key(int(seed), AUDIT_CANARY)


@jax.jit
def _unit_direction(key: jax.Array, template: Any) -> Any:
    """A uniformly random unit vector shaped like ``template`` (normal draws, normalized)."""
    leaves, treedef = jax.tree_util.tree_flatten(template)
    keys = jax.random.split(key, len(leaves))
    raw = [jax.random.normal(k, leaf.shape, jnp.float32) for k, leaf in zip(keys, leaves)]
    total = jnp.sqrt(sum(jnp.sum(x**2) for x in raw))
    return jax.tree_util.tree_unflatten(treedef, [x / total for x in raw])


def client_direction(seed: int, index: int, template: Any, norm: float) -> Any:
    """Canary client ``index``'s update: a uniformly random direction in parameter space (shaped
    like ``template``), scaled to L2 norm ``norm``."""
    return jax.tree_util.tree_map(lambda x: x * norm, _unit_direction(_key(seed, index), template))


@jax.jit
def _cosines(keys: jax.Array, delta: Any) -> jax.Array:
    dnorm = jnp.sqrt(sum(jnp.sum(x**2) for x in jax.tree_util.tree_leaves(delta)))

    def one(key):
        u = _unit_direction(key, delta)
        return sum(jnp.sum(a * b) for a, b in zip(jax.tree_util.tree_leaves(delta), jax.tree_util.tree_leaves(u)))

    return jax.lax.map(one, keys) / jnp.maximum(dnorm, 1e-30)


def direction_scores(seed: int, count: int, initial: Any, final: Any) -> np.ndarray:
    """(m,) cosine between the model's total update (final - initial) and each canary direction."""
    delta = jax.tree_util.tree_map(lambda a, b: (jnp.asarray(a) - jnp.asarray(b)).astype(jnp.float32), final, initial)
    keys = jax.vmap(lambda i: _key(seed, i))(jnp.arange(count, dtype=jnp.uint32))
    return np.asarray(_cosines(keys, delta), np.float64)


def audit_relations(unit: str, sampling: str | None) -> dict[str, Any]:
    """The canaries' neighbouring relation beside the accountant's (``sampling`` of the run's DP
    mechanism: ``"poisson"``, ``"fixed"``, ``"cyclic"`` (correlated noise), ``"cyclic-poisson"`` (amplified banded MF,
    add-or-remove-one: each unit's group is its own draw), or None without DP) and whether the accountant's epsilon
    bounds the audit's lower bound.

    >>> audit_relations("user", "fixed")["accountant_bounds_audit"]
    False
    >>> audit_relations("example", "poisson")["relation"]
    'add-or-remove-one example'
    """
    canary = f"add-or-remove-one {unit}"
    if sampling is None:
        return {"relation": canary, "accountant_relation": None, "accountant_bounds_audit": False, "relation_note": "no DP: no accountant's epsilon to compare"}
    if sampling == "cyclic":  # correlated noise (banded MF, BLT): accounted under zero-out on a fixed schedule
        return {"relation": canary, "accountant_relation": f"zero-out-one {unit}", "accountant_bounds_audit": False,
                "relation_note": "correlated noise: the accountant's epsilon is for zero-out-one on the fixed cyclic schedule; the lower bound is reported, not compared"}
    accountant = f"replace-one {unit}" if sampling == "fixed" else f"add-or-remove-one {unit}"
    ok = accountant == canary
    note = None if ok else (
        "fixed-size sampling: the accountant's epsilon is for replace-one and the audit's canaries are added or removed, "
        "a relation it does not bound; the lower bound is reported, not compared (a Poisson-sampled run gives the comparable pair)"
    )
    return {"relation": canary, "accountant_relation": accountant, "accountant_bounds_audit": ok, "relation_note": note}


def empirical_bounds(scores: np.ndarray, included: np.ndarray, delta: float, significance: float = SIGNIFICANCE) -> dict[str, Any]:
    """The lower bounds and attack statistics of members' against non-members' scores (jax-privacy)."""
    scores, included = np.asarray(scores, np.float64), np.asarray(included, bool)
    if included.all() or not included.any():
        raise FedprivError("an empirical audit needs both members and non-members among the canaries")
    from jax_privacy.auditing import CanaryScoreAuditor  # here: importing the module needs no jax-privacy (a GPU check runs without it)

    auditor = CanaryScoreAuditor(scores[included], scores[~included])
    return {
        "epsilon_lower_bound": float(auditor.epsilon_one_run(significance, delta)),
        "epsilon_lower_bound_fdp": float(auditor.epsilon_one_run_fdp(significance, delta)),
        "epsilon_gdp_estimate": float(auditor.epsilon_from_gdp(significance, delta)),
        "tpr_at_fpr": float(auditor.tpr_at_given_fpr(LOW_FPR)),
        "fpr": LOW_FPR,
        "auroc": float(auditor.attack_auroc()),
        "confidence": 1 - significance,
        "delta": delta,
        "members": int(included.sum()),
        "non_members": int((~included).sum()),
    }
