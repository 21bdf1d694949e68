"""Load a LOCAL Hugging Face dataset (a ``datasets.Dataset`` or a ``save_to_disk`` folder) as a corpus.

Users are the natural ids of ``user_column`` (``user_id`` by default, as for the tables),
partitioned with flwr-datasets' ``NaturalIdPartitioner``; a user's examples are built only when
asked (one partition at a time).
Column rules are those of :mod:`fedpriv.data.tabular` (lists of strings for tagged mode; tag
columns of ``ClassLabel`` ints are mapped to their names). This module never reaches the Hub:
it sets ``HF_DATASETS_OFFLINE=1`` and ``HF_HUB_OFFLINE=1`` (unless already set) on import.
Loading and reading users print no progress bar (:func:`quiet_progress`).
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import functools  # noqa: E402
from collections.abc import Iterator, Sequence  # noqa: E402
from contextlib import contextmanager  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import TYPE_CHECKING, Any  # noqa: E402

import numpy as np  # noqa: E402

from fedpriv.data.corpus import FederatedCorpus  # noqa: E402
from fedpriv.data.examples import Example  # noqa: E402
from fedpriv.data.stores import UserStore, user_sort_key  # noqa: E402
from fedpriv.data.tabular import RowConverter, RowError, note_skipped_rows  # noqa: E402
from fedpriv.errors import DataFormatError, EmptyCorpusError, FedprivError, SourceError  # noqa: E402

if TYPE_CHECKING:
    import datasets

_BATCH_ROWS = 4096
#: Files in a folder given as a source that name another loader, by suffix (a folder is read as a saved dataset).
_FILE_SOURCES = (".jsonl", ".json", ".ndjson", ".csv", ".tsv", ".parquet", ".conll", ".conllu", ".iob", ".bio", ".gz", ".bz2", ".xz")


@contextmanager
def quiet_progress() -> Iterator[None]:
    """No progress bar inside the block: datasets' (loading a saved dataset, selecting rows) and
    flwr-datasets' ``NaturalIdPartitioner``'s (``Generating partition_id_to_indices``, a plain
    tqdm), which would print into fedpriv's quiet logs. Both are as they were after the block.
    ``HF_DATASETS_DISABLE_PROGRESS_BARS=0`` in the environment keeps them."""
    import datasets
    from flwr_datasets.partitioner import natural_id_partitioner

    if datasets.config.HF_DATASETS_DISABLE_PROGRESS_BARS is False:  # the user asked for them
        yield
        return
    was_off = datasets.are_progress_bars_disabled()
    bar = getattr(natural_id_partitioner, "tqdm", None)
    datasets.disable_progress_bars()
    if bar is not None:
        natural_id_partitioner.tqdm = functools.partial(bar, disable=True)
    try:
        yield
    finally:
        if bar is not None:
            natural_id_partitioner.tqdm = bar
        if not was_off:
            datasets.enable_progress_bars()


def _folder_hint(path: Path) -> str:
    """What a folder that is no saved dataset seems to hold instead, and how to read that."""
    if (path / "state.json").exists() or (path / "dataset_dict.json").exists():
        return ""  # a saved dataset, damaged
    try:
        names = [p.name for p in path.iterdir() if p.is_file()]
    except OSError:
        return ""
    texts = sum(Path(n).suffix.lower() in (".txt", ".text") for n in names)
    if texts:
        return (
            f"; it holds {texts} text file(s): a folder of per-user text files is not read as users; make it one JSON Lines "
            "table (a user_id and a text per line), or one text file with users=mapping:PATH naming each line's user "
            "(docs/data.md, 'Plain text files, and a folder of per-user text files')"
        )
    files = sum(n.lower().endswith(_FILE_SOURCES) for n in names)
    if files:
        return f"; it holds {files} data file(s): give one file as the source"
    return ""


class HFNaturalIdStore(UserStore):
    """Users of a ``datasets.Dataset`` by the natural id in one column; examples built per user on request.

    Construction makes one batched pass over the needed columns to validate every row and count
    each user's non-empty examples (memory: one batch plus a count per user).
    """

    @quiet_progress()
    def __init__(self, ds: "datasets.Dataset", conv: RowConverter, label: str, tag_names: Sequence[str] | None = None):
        from flwr_datasets.partitioner import NaturalIdPartitioner

        self.kind = conv.kind
        self._conv = conv
        self._label = label
        self._tag_names = list(tag_names) if tag_names is not None else None
        self._ds = ds.with_format(None).select_columns(conv.columns)

        counts: dict[str, int] = {}
        row = 0
        for batch in self._ds.iter(batch_size=_BATCH_ROWS):
            for out in self._convert_batch(batch, first_row=row):
                if out is not None:
                    counts[out[0]] = counts.get(out[0], 0) + 1
            row += len(batch[conv.user_column])

        self._partitioner = NaturalIdPartitioner(partition_by=conv.user_column)
        self._partitioner.dataset = self._ds
        _ = self._partitioner.num_partitions  # builds partition_id_to_natural_id
        # raw ids that are one user (trimmed, NFC, casefolded with user_id_case="fold") share a user
        self._pids: dict[str, list[int]] = {}
        for pid, nid in sorted(self._partitioner.partition_id_to_natural_id.items()):
            if isinstance(nid, (str, int)) and not isinstance(nid, bool):
                self._pids.setdefault(conv.id_key(nid), []).append(pid)
        self._ids = tuple(sorted((u for u in self._pids if counts.get(u)), key=user_sort_key))
        self._counts = np.array([counts[u] for u in self._ids], dtype=np.int64)
        self._has = frozenset(self._ids)

    def _convert_batch(self, batch: dict[str, list[Any]], first_row: int | None) -> list[tuple[str, Example] | None]:
        cols = self._conv.columns
        n = len(batch[cols[0]])
        out = []
        for i in range(n):
            r = {c: batch[c][i] for c in cols}
            try:
                if self._tag_names is not None:
                    r[self._conv.tags_column] = self._map_tags(r[self._conv.tags_column])
                out.append(self._conv.convert(r))
            except RowError as e:
                where = f"row {first_row + i + 1}" if first_row is not None else f"example {i + 1} of a user"
                raise DataFormatError(self._label, where, str(e)) from None
        return out

    def _map_tags(self, tags: Any) -> Any:
        if not isinstance(tags, list):
            return tags
        names = self._tag_names
        try:
            return [names[t] if isinstance(t, int) and not isinstance(t, bool) and t >= 0 else t for t in tags]
        except IndexError:
            raise RowError(f"tag id out of range of the {len(names)} ClassLabel names") from None

    def user_ids(self) -> Sequence[str]:
        return self._ids

    def counts(self) -> np.ndarray:
        return self._counts

    @quiet_progress()
    def examples(self, user_id: str) -> list[Example]:
        if user_id not in self._has:
            raise KeyError(user_id)
        pids = self._pids[user_id]
        if len(pids) == 1:
            part = self._partitioner.load_partition(pids[0]).to_dict()
        else:  # raw ids merged into one user: their rows in file order, as the table loaders give them
            self._partitioner.load_partition(pids[0])  # builds the partitions' row indices
            rows = sorted(i for pid in pids for i in self._partitioner._partition_id_to_indices[pid])
            part = self._ds.select(rows).to_dict()
        return [out[1] for out in self._convert_batch(part, first_row=None) if out is not None]


def _tag_class_names(feature: Any) -> list[str] | None:
    """ClassLabel names when ``feature`` is a sequence of ClassLabel, else None."""
    import datasets

    inner = getattr(feature, "feature", None)
    if isinstance(inner, datasets.ClassLabel):
        return list(inner.names)
    return None


@quiet_progress()
def load_hf_dataset(
    dataset_or_path: "datasets.Dataset | datasets.DatasetDict | str | os.PathLike[str]",
    *,
    user_column: str = "user_id",
    text_column: str = "text",
    tokens_column: str | None = None,
    tags_column: str | None = None,
    timestamp_column: str | None = None,
    normalize_text: bool = True,
    split: str | None = None,
    placeholder_users: str = "skip",
    user_id_case: str = "keep",
) -> FederatedCorpus:
    """A corpus from a local ``datasets.Dataset`` or a folder written by ``save_to_disk``.

    A ``DatasetDict`` needs ``split=`` to pick one split. User ids follow the table loaders' rules
    (:class:`~fedpriv.data.tabular.RowConverter`: trimmed, NFC; ``placeholder_users``,
    ``user_id_case`` as in :func:`~fedpriv.data.tabular.load_table`). Timestamps are epoch seconds UTC (see
    :func:`fedpriv.data.tabular.parse_timestamp`). Raises :class:`SourceError` (no such folder,
    not a saved dataset), :class:`FedprivError` (missing column, DatasetDict without split),
    :class:`DataFormatError` (bad row, named ``"row N"``) or :class:`EmptyCorpusError`.
    """
    import datasets

    conv = RowConverter(
        user_column=user_column,
        text_column=text_column,
        tokens_column=tokens_column,
        tags_column=tags_column,
        timestamp_column=timestamp_column,
        normalize_text=normalize_text,
        placeholder_users=placeholder_users,
        user_id_case=user_id_case,
    )
    if isinstance(dataset_or_path, (str, os.PathLike)):
        path = Path(dataset_or_path)
        if not path.is_dir():
            raise SourceError(f"{path}: no such dataset folder (expected a directory written by Dataset.save_to_disk)")
        try:
            ds = datasets.load_from_disk(str(path))
        except (FileNotFoundError, ValueError, OSError, KeyError, TypeError) as e:  # KeyError, TypeError: a damaged state.json
            why = " ".join(f"{type(e).__name__}: {e}".split())
            raise SourceError(f"{path}: not a dataset saved with save_to_disk, or a damaged one ({why}){_folder_hint(path)}") from None
        label, name = str(path), path.name
    else:
        ds = dataset_or_path
        label = name = getattr(getattr(ds, "info", None), "dataset_name", None) or "hf-dataset"

    if isinstance(ds, datasets.DatasetDict):
        if split is None:
            raise FedprivError(f"{label}: a DatasetDict with splits {sorted(ds)}; pass split= to pick one")
        if split not in ds:
            raise FedprivError(f"{label}: no split {split!r}; the splits are {sorted(ds)}")
        ds = ds[split]
        name = f"{name}[{split}]"
    elif split is not None and isinstance(ds, datasets.Dataset):
        raise FedprivError(f"{label}: split={split!r} given, but this is a single Dataset, not a DatasetDict")
    if not isinstance(ds, datasets.Dataset):
        raise FedprivError(f"{label}: expected a map-style datasets.Dataset or DatasetDict, got {type(ds).__name__}")

    missing = [c for c in conv.columns if c not in ds.column_names]
    if missing:
        which = ", ".join(f"{k}=" for k, v in (("user_column", user_column), ("text_column", text_column), ("tokens_column", tokens_column), ("tags_column", tags_column), ("timestamp_column", timestamp_column)) if v in missing)
        raise FedprivError(f"{label}: no column(s) {', '.join(map(repr, missing))}; the dataset has columns {', '.join(map(repr, ds.column_names))} (pass {which} to name yours)")
    if ds.num_rows == 0:
        raise EmptyCorpusError(f"{label}: the dataset has no rows")

    tag_names = _tag_class_names(ds.features[tags_column]) if tags_column is not None else None
    store = HFNaturalIdStore(ds, conv, label, tag_names)
    if not store.user_ids():
        raise EmptyCorpusError(f"{label}: no examples (every row's text or token list is empty)")
    corpus = FederatedCorpus(store, name)
    note_skipped_rows(corpus, conv)
    return corpus
