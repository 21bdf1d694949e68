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
``SPILL_ABOVE_BYTES``).
"""

from __future__ import annotations

import os
import re
import xml.etree.ElementTree as ET
from collections.abc import Callable, Collection, Iterator, Sequence
from datetime import datetime, timezone
from pathlib import Path

from fedpriv.data.corpus import FederatedCorpus, default_spill_path
from fedpriv.data.examples import TextExample
from fedpriv.data.tokenize import normalize, split_sentences, strip_html
from fedpriv.errors import DataFormatError, SourceError

SPILL_ABOVE_BYTES = 256 * 2**20
#: Stack Exchange's "Community" account: owns tag wikis and automatic posts; not a person.
COMMUNITY_ACCOUNT = "-1"


class _CountingReader:
    """A binary file wrapper that reports bytes read (for progress on big dumps)."""

    def __init__(self, f, callback: Callable[[int], None] | None):  # noqa: ANN001
        self._f = f
        self._cb = callback
        self.read_bytes = 0

    def read(self, n: int = -1) -> bytes:
        data = self._f.read(n)
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
    if spill_to is None and path.stat().st_size > SPILL_ABOVE_BYTES:
        spill_to = default_spill_path(path)
    stats: dict = {}
    corpus = FederatedCorpus.from_stream(
        iter_posts(path, post_types, drop_code, stats, progress, drop), "text", name=f"stackexchange:{path.name}", spill_to=spill_to
    )
    corpus.info.update(stats)
    if stats["skipped_dropped_owner"]:
        who = " and ".join("-1 (the Community account)" if o == COMMUNITY_ACCOUNT else o for o in drop)
        corpus.note(f"{stats['skipped_dropped_owner']} posts of account {who} dropped (drop_owners={drop}; pass drop_owners=[] to keep them)")
    return corpus
