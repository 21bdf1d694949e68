"""Stack Exchange data-dump ``Posts.xml`` (every Stack Exchange site's dump, Stack Overflow's included).

* user = ``OwnerUserId``; posts without one (deleted accounts) are skipped and counted in
  ``corpus.info["skipped_no_owner"]``; posts of the accounts in ``drop_owners`` (default ``-1``,
  the site's "Community" account, which owns tag wikis and automatic posts and is no person)
  are skipped, counted in ``corpus.info["skipped_dropped_owner"]`` and said in a note;
* examples = the sentences of the Title and of the Body (HTML stripped, code blocks dropped by
  default), normalized like the TFF Stack Overflow data (lowercase, punctuation split);
* timestamp = ``CreationDate`` (UTC) in epoch seconds;
* every post type by default (questions, answers, tag-wiki texts); ``post_types=("1", "2")``
  keeps questions and answers only, as the TFF Stack Overflow data does.

The file is streamed with ``iterparse`` and each element cleared after use, so a multi-GB dump
runs in bounded memory when the examples are spilled to disk (``spill_to``; automatic above
``SPILL_ABOVE_BYTES``). The parser is fed 1 MiB reads, doubled (up to 64 MiB) while a read ends
no element: expat 2.5 scans a token that spans reads again from its start at each read, so
iterparse's own 16 KB reads made one huge attribute (a 24 MB ``Body``) cost time quadratic in its
size; now it costs time linear in it. Entity expansion stays bounded by expat and external
entities are refused, as before (errors name the file and line).

The automatic spill is a file in a private temporary folder (mode 0700; the file 0600), said in
a note, and deleted with its folder when the corpus's store is no longer used (garbage-collected)
or at interpreter exit; a file named with ``spill_to`` is the caller's and is never deleted.

A dump that gives no example is refused with how many posts were read and why each group was
skipped (no ``OwnerUserId``, a dropped account, another post type, no text once HTML and code
are stripped).
"""

from __future__ import annotations

import os
import re
import shutil
import sqlite3
import weakref
import xml.etree.ElementTree as ET
from collections.abc import Callable, Collection, Iterator, Sequence
from datetime import datetime, timezone
from pathlib import Path

from fedpriv.data.corpus import FederatedCorpus, default_spill_path
from fedpriv.data.examples import TextExample
from fedpriv.data.tokenize import normalize, split_sentences, strip_html
from fedpriv.errors import DataFormatError, EmptyCorpusError, SourceError

SPILL_ABOVE_BYTES = 256 * 2**20
#: Stack Exchange's "Community" account: owns tag wikis and automatic posts; not a person.
COMMUNITY_ACCOUNT = "-1"


#: What the XML parser is fed at a time (see the module docstring): the first read, and the read
#: after one that gave events; a read that gave none is followed by one twice as large, up to
#: ``READ_MAX_BYTES``.
READ_BYTES = 2**20
READ_MAX_BYTES = 64 * 2**20


class _CountingReader:
    """A binary file read in large chunks, whatever size the parser asks for, reporting bytes read
    (for progress on big dumps). The reader of the events sets ``progressed`` on each one."""

    def __init__(self, f, callback: Callable[[int], None] | None):  # noqa: ANN001
        self._f = f
        self._cb = callback
        self.read_bytes = 0
        self.progressed = True
        self._size = READ_BYTES

    def read(self, n: int = -1) -> bytes:
        # iterparse asks for 16 KB; expat 2.5 re-scans an unfinished token from its start at each
        # feed, so small reads make a huge attribute quadratic. A read that ended no element
        # (a token still open) is followed by a larger one: the re-scans add up to O(token size).
        self._size = READ_BYTES if self.progressed else min(2 * self._size, READ_MAX_BYTES)
        self.progressed = False
        data = self._f.read() if n is None or n < 0 else self._f.read(max(n, self._size))
        self.read_bytes += len(data)
        if self._cb is not None:
            self._cb(self.read_bytes)
        return data


def parse_creation_date(value: str) -> float:
    """``2015-01-27T20:09:32.720`` (UTC, as in the dumps) -> epoch seconds."""
    t = datetime.fromisoformat(value)
    if t.tzinfo is None:
        t = t.replace(tzinfo=timezone.utc)
    return t.timestamp()


def iter_posts(
    path: str | os.PathLike[str],
    post_types: tuple[str, ...] | None = None,
    drop_code: bool = True,
    stats: dict | None = None,
    progress: Callable[[int], None] | None = None,
    drop_owners: Collection[str] = (),
) -> Iterator[tuple[str, TextExample]]:
    """``(OwnerUserId, sentence example)`` pairs in file order, without the posts of ``drop_owners``.
    ``stats`` (if given) is filled with ``posts``, ``posts_used``, ``skipped_no_owner``,
    ``skipped_dropped_owner``, ``skipped_type`` and ``skipped_empty``."""
    stats = {} if stats is None else stats
    for k in ("posts", "posts_used", "skipped_no_owner", "skipped_dropped_owner", "skipped_type", "skipped_empty"):
        stats[k] = 0
    drop = frozenset(str(o) for o in drop_owners)
    skip = frozenset({"pre"}) if drop_code else frozenset()
    with open(path, "rb") as raw:
        reader = _CountingReader(raw, progress)
        it = ET.iterparse(reader, events=("start", "end"))
        root = None
        for event, elem in _xml_events(path, it):
            reader.progressed = True
            if root is None:
                root = elem
                if elem.tag != "posts":
                    raise DataFormatError(path, 1, f"root element is <{elem.tag}>, expected <posts>")
                continue
            if event != "end" or elem.tag != "row":
                continue
            stats["posts"] += 1
            attrs = dict(elem.attrib)
            elem.clear()
            root.clear()  # drop references to finished rows: memory stays bounded
            yield from _post_examples(path, attrs, post_types, skip, stats, drop)


def _xml_events(path, it) -> Iterator:  # noqa: ANN001
    """The parser's events; what it refuses becomes a DataFormatError naming the line."""
    while True:
        try:
            item = next(it)
        except StopIteration:
            return
        except ET.ParseError as e:
            line, col = e.position
            reason = re.sub(r": line \d+, column \d+$", "", str(e))  # the position is said once, as file:line and column
            raise DataFormatError(path, line, f"malformed XML at column {col}: {reason}") from None
        except (LookupError, ValueError) as e:  # the XML declaration names an encoding Python's expat cannot read
            reason = " ".join(str(e).split())
            raise DataFormatError(path, 1, f"the encoding in the XML declaration cannot be read ({reason}); save the file as UTF-8") from None
        yield item


def _post_examples(path, attrs: dict, post_types, skip, stats, drop=frozenset()) -> Iterator[tuple[str, TextExample]]:  # noqa: ANN001
    post_id = attrs.get("Id", "?")
    if post_types is not None and attrs.get("PostTypeId") not in post_types:
        stats["skipped_type"] += 1
        return
    owner = attrs.get("OwnerUserId", "").strip()
    if not owner:
        stats["skipped_no_owner"] += 1
        return
    if owner in drop:
        stats["skipped_dropped_owner"] += 1
        return
    created = attrs.get("CreationDate")
    try:
        ts = parse_creation_date(created) if created else None
    except ValueError:
        raise DataFormatError(path, f"post Id={post_id}", f"unparsable CreationDate {created!r}") from None
    sentences = []
    title = attrs.get("Title")
    if title:
        sentences.extend(split_sentences(title))
    body = attrs.get("Body")
    if body:
        sentences.extend(split_sentences(strip_html(body, skip)))
    texts = [t for t in (normalize(s) for s in sentences) if t]
    if not texts:
        stats["skipped_empty"] += 1
        return
    stats["posts_used"] += 1
    for text in texts:
        yield owner, TextExample(text, ts)


def load_stackexchange(
    path: str | os.PathLike[str],
    *,
    post_types: tuple[str, ...] | None = None,
    drop_code: bool = True,
    spill_to: str | os.PathLike[str] | None = None,
    progress: Callable[[int], None] | None = None,
    drop_owners: Sequence[str | int] = (COMMUNITY_ACCOUNT,),
) -> FederatedCorpus:
    """A ``Posts.xml`` dump as a FederatedCorpus (see the module docstring for the rules)."""
    path = Path(path)
    if not path.is_file():
        raise SourceError(f"{path}: no such file")
    if isinstance(drop_owners, (str, int)) or not all(isinstance(o, (str, int)) and not isinstance(o, bool) for o in drop_owners):
        raise SourceError(f"drop_owners={drop_owners!r}: expected a list of OwnerUserId values, e.g. [\"-1\"] or []")
    drop = [str(o) for o in drop_owners]
    size = path.stat().st_size
    temporary = spill_to is None and size > SPILL_ABOVE_BYTES
    if temporary:
        spill_to = default_spill_path(path)
    stats: dict = {}
    try:
        try:
            corpus = FederatedCorpus.from_stream(
                iter_posts(path, post_types, drop_code, stats, progress, drop), "text", name=f"stackexchange:{path.name}", spill_to=spill_to
            )
        except EmptyCorpusError:
            if stats.get("posts_used") == 0:
                raise EmptyCorpusError(f"{path}: the dump gave no examples: {_why_no_examples(stats, post_types, drop, drop_code)}") from None
            raise
        if temporary:
            _delete_when_unused(corpus.store, Path(spill_to))
    except BaseException:
        if temporary:  # nothing of a failed automatic spill stays
            shutil.rmtree(Path(spill_to).parent, ignore_errors=True)
        raise
    if temporary:
        corpus.note(
            f"{path.name} is {size / 2**20:,.0f} MB (over {SPILL_ABOVE_BYTES / 2**20:,.0f} MB): its examples were spilled to a temporary file, "
            f"{spill_to} (readable by you only), that is deleted when the corpus is no longer used and at exit; spill_to=PATH keeps them"
        )
    corpus.info.update(stats)
    if stats["skipped_dropped_owner"]:
        who = " and ".join("-1 (the Community account)" if o == COMMUNITY_ACCOUNT else o for o in drop)
        corpus.note(f"{stats['skipped_dropped_owner']} posts of account {who} dropped (drop_owners={drop}; pass drop_owners=[] to keep them)")
    return corpus


def _why_no_examples(stats: dict, post_types, drop: Sequence[str], drop_code: bool) -> str:  # noqa: ANN001
    """Why a dump gave no example, from the counts :func:`iter_posts` keeps."""
    n = stats["posts"]
    if n == 0:
        return "it holds no <row> element under <posts>"
    why = []
    if stats["skipped_type"]:
        why.append(f"{stats['skipped_type']:,} of a PostTypeId not in post_types={list(post_types or [])}")
    if stats["skipped_no_owner"]:
        why.append(f"{stats['skipped_no_owner']:,} without an OwnerUserId (deleted accounts, or posts that name only an OwnerDisplayName)")
    if stats["skipped_dropped_owner"]:
        who = " and ".join(drop) + (", the Community account" if COMMUNITY_ACCOUNT in drop else "")
        why.append(f"{stats['skipped_dropped_owner']:,} of dropped account {who} (drop_owners={list(drop)}; drop_owners=[] keeps them)")
    if stats["skipped_empty"]:
        stripped = "HTML and code blocks were stripped (drop_code=False keeps the code)" if drop_code else "HTML was stripped"
        why.append(f"{stats['skipped_empty']:,} with no text in their Title and Body attributes once {stripped}")
    return f"{n:,} post{'s' if n != 1 else ''} read, none used: " + "; ".join(why)


def _delete_when_unused(store: object, spill: Path) -> None:
    """Make the automatic spill private (0600) and delete it, with its private folder, when its
    store is garbage-collected (the store, not the corpus: corpora derived from the loaded one
    share it) or at interpreter exit. The store's SQLite connection is closed first; only the
    process that made the spill deletes it (a forked child's copy of the store does not)."""
    os.chmod(spill, 0o600)
    weakref.finalize(store, _remove_spill, getattr(store, "_con", None), str(spill.parent), os.getpid())


def _remove_spill(con: sqlite3.Connection | None, folder: str, pid: int) -> None:
    if os.getpid() != pid:
        return
    if con is not None:
        try:
            con.close()
        except sqlite3.Error:
            pass
    shutil.rmtree(folder, ignore_errors=True)
