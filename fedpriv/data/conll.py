"""CoNLL / IOB NER files: one ``token<TAB>tag`` line per token, a blank line between sentences.

Columns may be separated by tabs or spaces; the token is the first column and the tag the last
(so four-column CoNLL-2003 files work too). ``-DOCSTART-`` lines separate documents. Tags must be
``O`` or ``<P>-<type>`` with P in B, I, E, S, L, U (BIO, IOBES and BILOU schemes).

How sentences become users (``users=``):

* ``"document"``: one user per ``-DOCSTART-`` document (a file without any is one document);
* ``"sentences:N"``: each run of N contiguous sentences is a user (the last may be shorter);
* ``"clients:N"``: N users (clients), sentence i going to client i mod N, so every client gets
  an even share of the file (the n-worker splits of Jana and Biemann 2021);
* ``"mapping:PATH"``: a file with one user id per line, line i naming the user of sentence i
  (0-based, in file order); its line count must equal the number of sentences.

User ids are ``doc-0007`` / ``block-0007`` (zero-padded in file order) or the mapping's ids.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path

from fedpriv.data.corpus import FederatedCorpus
from fedpriv.data.examples import TaggedExample
from fedpriv.errors import DataFormatError, FedprivError, SourceError

_TAG = re.compile(r"^(O|[BIESLU]-\S+)$")


def iter_sentences(path: str | os.PathLike[str]) -> Iterator[tuple[int, TaggedExample]]:
    """``(document index, sentence)`` in file order."""
    doc = 0
    seen_in_doc = False
    tokens: list[str] = []
    tags: list[str] = []
    with open(path, "rb") as f:
        for n, raw in enumerate(f, start=1):
            try:
                line = raw.decode("utf-8").rstrip("\r\n")
            except UnicodeDecodeError as e:
                raise DataFormatError(path, n, f"not valid UTF-8 ({e.reason})") from None
            if line.startswith("-DOCSTART-"):
                if tokens:
                    yield doc, TaggedExample(tuple(tokens), tuple(tags))
                    tokens, tags = [], []
                    seen_in_doc = True
                if seen_in_doc:
                    doc += 1
                    seen_in_doc = False
                continue
            if not line.strip():
                if tokens:
                    yield doc, TaggedExample(tuple(tokens), tuple(tags))
                    tokens, tags = [], []
                    seen_in_doc = True
                continue
            cols = line.split("\t") if "\t" in line else line.split()
            cols = [c for c in cols if c != ""]
            if len(cols) < 2:
                raise DataFormatError(path, n, f"expected 'token<TAB>tag', got {line[:60]!r}")
            token, tag = cols[0].strip(), cols[-1].strip()
            if not _TAG.match(tag):
                raise DataFormatError(path, n, f"tag {tag[:30]!r} is not O or B-/I-/E-/S-/L-/U-<type>")
            tokens.append(token)
            tags.append(tag)
    if tokens:
        yield doc, TaggedExample(tuple(tokens), tuple(tags))


def _parse_users_rule(users: str) -> tuple[str, object]:
    if users == "document":
        return "document", None
    for rule in ("sentences", "clients"):  # "sentences:N", "clients:N" with N >= 1
        if users.startswith(rule + ":"):
            n = users.split(":", 1)[1]
            if not n.isdigit() or int(n) < 1:
                raise FedprivError(f"users rule {users!r}: N in '{rule}:N' must be a positive integer")
            return rule, int(n)
    if users.startswith("mapping:"):
        return "mapping", Path(users.split(":", 1)[1])
    raise FedprivError(f"users rule {users!r}: expected 'document', 'sentences:N', 'clients:N' or 'mapping:PATH'")


def load_conll(path: str | os.PathLike[str], users: str = "sentences:10") -> FederatedCorpus:
    """A CoNLL/IOB file as a FederatedCorpus of tagged sentences, users formed by ``users``."""
    path = Path(path)
    if not path.is_file():
        raise SourceError(f"{path}: no such file")
    rule, arg = _parse_users_rule(users)
    sentences = list(iter_sentences(path))
    if not sentences:
        raise FedprivError(f"{path}: no sentences found") from None
    if rule == "document":
        width = len(str(sentences[-1][0]))
        ids = [f"doc-{d:0{width}d}" for d, _ in sentences]
    elif rule == "sentences":
        width = len(str((len(sentences) - 1) // arg))
        ids = [f"block-{i // arg:0{width}d}" for i in range(len(sentences))]
    elif rule == "clients":
        if arg > len(sentences):
            raise FedprivError(f"{path}: {len(sentences)} sentences cannot make {arg} clients")
        width = len(str(arg - 1))
        ids = [f"client-{i % arg:0{width}d}" for i in range(len(sentences))]
    else:
        ids = _read_mapping(arg, len(sentences), path)
    return FederatedCorpus.from_stream(
        zip(ids, (s for _, s in sentences)), "tagged", name=f"conll:{path.name}[{users}]"
    )


def _read_mapping(mapping: Path, n_sentences: int, source: Path) -> list[str]:
    if not mapping.is_file():
        raise SourceError(f"{mapping}: no such user-mapping file")
    ids = []
    with open(mapping, encoding="utf-8", errors="strict") as f:
        try:
            for n, line in enumerate(f, start=1):
                uid = line.strip()
                if not uid:
                    raise DataFormatError(mapping, n, "empty user id")
                ids.append(uid)
        except UnicodeDecodeError as e:
            raise DataFormatError(mapping, len(ids) + 1, f"not valid UTF-8 ({e.reason})") from None
    if len(ids) != n_sentences:
        raise DataFormatError(mapping, None, f"has {len(ids)} user ids but {source} has {n_sentences} sentences")
    return ids
