"""The ``users=`` rules of the loaders whose files name no user per example (CoNLL, plain text).

A loader reads its units (sentences, lines) in file order, then a rule makes them users:

* ``"auto"`` (the default): the file's own grouping when it has one (CoNLL documents, text
  paragraphs), else blocks of 10 units;
* the loader's natural grouping by name (``"document"``, ``"paragraph"``);
* ``"<unit>s:N"`` (``sentences:10``, ``lines:10``): each run of N contiguous units is a user (the
  last may be shorter); ids ``block-0007``;
* ``"clients:N"``: N users, unit i going to client i mod N (even shares; the n-worker splits of
  Jana and Biemann 2021); ids ``client-07``;
* ``"mapping:PATH"``: a file with one user id per line, line i naming the user of unit i.

Synthetic users (blocks, clients, and auto's fallback) are said in a note on the corpus
(:meth:`fedpriv.data.corpus.FederatedCorpus.note`), so the log and the run record them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from fedpriv.data.corpus import normalized_user_id
from fedpriv.data.tabular import decoded_lines, is_placeholder_id
from fedpriv.errors import DataFormatError, FedprivError, SourceError

DEFAULT_BLOCK = 10


@dataclass(frozen=True)
class UsersRule:
    """A parsed ``users=`` value: ``kind`` is auto, natural, blocks, clients, mapping or comment."""

    text: str
    kind: str
    n: int = 0
    path: Path | None = None
    key: str = ""


def parse_users(users: object, unit: str, natural: str, comment: bool = False) -> UsersRule:
    """``users`` as a rule; ``unit`` names the blocks (``sentence`` -> ``sentences:N``), ``natural``
    the loader's own grouping; ``comment`` allows ``comment:KEY`` (CoNLL)."""
    if not isinstance(users, str):
        raise FedprivError(f"users rule {users!r}: expected a string such as 'auto' or '{unit}s:10'")
    if users == "auto":
        return UsersRule(users, "auto")
    if users == natural:
        return UsersRule(users, "natural")
    for rule, kind in ((f"{unit}s", "blocks"), ("clients", "clients")):
        if users.startswith(rule + ":"):
            n = users.split(":", 1)[1]
            if not n.isdigit() or int(n) < 1:
                raise FedprivError(f"users rule {users!r}: N in '{rule}:N' must be a positive integer")
            return UsersRule(users, kind, int(n))
    if users.startswith("mapping:") and users[len("mapping:"):]:
        return UsersRule(users, "mapping", path=Path(users[len("mapping:"):]))
    if comment and users.startswith("comment:") and users[len("comment:"):].strip():
        return UsersRule(users, "comment", key=users[len("comment:"):].strip())
    choices = ["auto", natural, f"{unit}s:N", "clients:N", "mapping:PATH"] + (["comment:KEY"] if comment else [])
    raise FedprivError(f"users rule {users!r}: expected {', '.join(repr(c) for c in choices)}")


def synthetic_ids(rule: UsersRule, count: int, unit: str, source: Path) -> tuple[list[str], str]:
    """User ids of ``count`` units under a blocks or clients rule, and the note that says so."""
    if rule.kind == "blocks":
        width = len(str((count - 1) // rule.n))
        ids = [f"block-{i // rule.n:0{width}d}" for i in range(count)]
        return ids, f"users are synthetic: {len(set(ids))} blocks of {rule.n} consecutive {unit}s (users={rule.text!r})"
    if rule.n > count:
        raise FedprivError(f"{source}: {count} {unit}s cannot make {rule.n} clients")
    width = len(str(rule.n - 1))
    ids = [f"client-{i % rule.n:0{width}d}" for i in range(count)]
    return ids, f"users are synthetic: {rule.n} clients, {unit} i going to client i mod {rule.n} (users={rule.text!r})"


def fallback_blocks(unit: str) -> UsersRule:
    """What ``auto`` uses when the file has no grouping of its own."""
    return UsersRule(f"{unit}s:{DEFAULT_BLOCK}", "blocks", DEFAULT_BLOCK)


def named_user(raw: str) -> str:
    """A user id a file names (a mapping line, a CoNLL comment), as the tables read ids: a BOM
    dropped, trimmed, in Unicode NFC form (:func:`fedpriv.data.corpus.normalized_user_id`)."""
    return normalized_user_id(raw.replace("\ufeff", ""))


def placeholder_problem(uid: str) -> str | None:
    """Why ``uid`` cannot name one user (a deleted account's or a missing value's placeholder:
    ``[deleted]``, ``nan``, ``NA``, ...), or None."""
    if is_placeholder_id(uid):
        return f"user id {uid!r} is a placeholder (a deleted account or a missing value): it stands for many people, not one user"
    return None


def read_mapping(mapping: Path, count: int, unit: str, source: Path) -> list[str]:
    """The user ids of a mapping file, one per line (:func:`named_user`); there must be one per unit
    of ``source``, and none may be a placeholder (:func:`placeholder_problem`)."""
    if not mapping.is_file():
        raise SourceError(f"{mapping}: no such user-mapping file")
    ids = []
    with open(mapping, "rb") as f:
        for n, line in decoded_lines(mapping, f):  # strictly UTF-8, errors naming the line (as every text loader)
            uid = named_user(line)
            if not uid:
                raise DataFormatError(mapping, n, "empty user id (expected one user id per line)")
            why = placeholder_problem(uid)
            if why:
                raise DataFormatError(mapping, n, f"{why}; name the user of this {unit}")
            ids.append(uid)
    if len(ids) != count:
        raise DataFormatError(mapping, None, f"has {len(ids)} user ids but {source} has {count} {unit}s")
    return ids
