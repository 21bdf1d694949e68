"""BERT run directories: the tokenizer saved next to the model, and pretrained encoders loaded back.

Pretrain -> fine-tune chain::

    fedpriv train central experiments/ncbi-mlm-bert-small.toml --out runs/ncbi-mlm-bert-small
    fedpriv train central experiments/ncbi-ner-bert-small.toml   # task.options.pretrained = "runs/ncbi-mlm-bert-small"

A BERT task (``mlm`` or ``bert-ner``) writes ``tokenizer.json`` into its run directory
(:func:`save_tokenizer`, JSON via :func:`fedpriv.jsonio.write_json_atomic`, never pickle): the
WordPiece vocabulary learned from the TRAINING users (:meth:`WordPieceVocab.to_json`), whether
words are lowercased before tokenization, and the model's shape (the :class:`BertConfig` fields
that fix the parameter shapes, and the preset's name).

:func:`load_pretrained` reads a finished run back: ``tokenizer.json`` and the final parameters
(``params.msgpack``, which the trainer writes when the run ends; equal to its last checkpoint's
parameters). A run that has a checkpoint but no ``params.msgpack`` did not finish and is refused
(fine-tuning from an arbitrary intermediate step would make comparisons meaningless); run its
command again to finish it. :func:`check_compatible` refuses a fine-tuning model whose shape
(preset) differs from the pretrained one, or a tokenizer whose size differs from the encoder's
token embedding, with messages that say what to change.

Relative paths in ``task.options.pretrained`` are resolved against the CURRENT WORKING DIRECTORY,
like ``data.source`` (an experiment config does not know where its file lives; run ``fedpriv``
from the repository root, as the shipped configs assume).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
from flax import serialization

from fedpriv.errors import ConfigError, FedprivError
from fedpriv.jsonio import read_json, write_json_atomic
from fedpriv.models.bert import PRESETS, BertConfig
from fedpriv.rundir import CHECKPOINT, PARAMS, TOKENIZER, VOCABULARY
from fedpriv.vocab.wordpiece import WordPieceVocab

#: What ``tokenizer.json`` keeps of that record: the settings and what the DP guarantee covers.
RELEASED_KEYS = ("source", "users", "vocab_size", "lowercase", "alphabet", "public_source", "guarantee")
RELEASED_DP_KEYS = ("mechanism", "unit", "epsilon", "delta", "delta_requested", "sigma", "laplace_scale", "threshold",
                    "tuple_size", "partition", "threshold_rule", "words_kept", "guarantee")
FORMAT = "fedpriv-bert-tokenizer"
#: BertConfig fields that fix the parameter shapes (dropout does not; vocab_size is the tokenizer's)
SHAPE_FIELDS = ("hidden", "layers", "heads", "intermediate", "max_len", "type_vocab")


def shape_of(cfg: BertConfig) -> dict[str, int]:
    return {f: int(getattr(cfg, f)) for f in SHAPE_FIELDS}


def preset_name(cfg: BertConfig) -> str | None:
    """The preset whose shape ``cfg`` has (vocabulary size and dropout aside), or None."""
    for name, p in PRESETS.items():
        if shape_of(p) == shape_of(cfg):
            return name
    return None


def _describe(shape: dict[str, int], preset: str | None) -> str:
    dims = ", ".join(f"{k} {v}" for k, v in shape.items())
    return f"{preset!r} ({dims})" if preset else f"a custom shape ({dims})"


def tokenizer_record(task: Any) -> dict:
    """What :func:`save_tokenizer` writes for a BERT task (``task.vocab`` a PieceVocab, ``task.cfg``)."""
    v = task.vocab
    # Another tokenizer is saved as its vocabulary, which reloads as BERT's greedy longest-match one.
    tok = v.tokenizer if isinstance(v.tokenizer, WordPieceVocab) else WordPieceVocab(v.tokens)
    return {
        "format": FORMAT,
        "version": 1,
        "task": task.name,
        "lowercase": bool(v.lowercase),
        "preset": preset_name(task.cfg),
        "bert": shape_of(task.cfg),
        "vocab_size": len(v),
        "vocabulary": released_vocabulary(getattr(task, "vocabulary_record", None)),
        "wordpiece": tok.to_json(),
    }


def released_vocabulary(record: dict | None) -> dict | None:
    """The part of a vocabulary record that may travel with the tokenizer: its settings and, for a
    DP vocabulary, the mechanism's parameters and guarantee; not the figures computed from the raw
    data (example counts, the longest example, the non-private vocabulary), which stay in the
    learning run's ``vocabulary.json``."""
    if record is None:
        return None
    out = {k: record[k] for k in RELEASED_KEYS if k in record}
    dp = record.get("dp")
    out["dp"] = {k: dp[k] for k in RELEASED_DP_KEYS if k in dp} if dp else None
    return out


def save_tokenizer(task: Any, run_dir: str | os.PathLike[str]) -> Path:
    """Write ``tokenizer.json`` (see the module docstring) into ``run_dir``; a run that learned its
    vocabulary also gets the full record in ``vocabulary.json``."""
    d = Path(run_dir)
    d.mkdir(parents=True, exist_ok=True)
    record = getattr(task, "vocabulary_record", None)
    if record is not None and getattr(task, "pretrained_from", None) is None:
        write_json_atomic(d / VOCABULARY, record)
    return write_json_atomic(d / TOKENIZER, tokenizer_record(task), indent=None)


@dataclass
class Tokenizer:
    """A saved tokenizer: the WordPiece vocabulary, lowercasing, and the model shape it served."""

    wordpiece: WordPieceVocab
    lowercase: bool
    shape: dict[str, int]
    preset: str | None
    task: str
    vocabulary: dict | None = None  # where the vocabulary came from, its DP guarantee if any


def load_tokenizer(run_dir: str | os.PathLike[str]) -> Tokenizer:
    path = Path(run_dir) / TOKENIZER
    if not path.is_file():
        raise ConfigError(
            f"task.options.pretrained: {run_dir} has no {TOKENIZER}; it is not the run directory of a BERT "
            "pretraining run (train one with task.kind = 'mlm' first)"
        )
    obj = read_json(path, "BERT tokenizer file")
    if not isinstance(obj, dict) or obj.get("format") != FORMAT:
        raise FedprivError(f"{path}: not a BERT tokenizer file (expected format {FORMAT!r})")
    try:
        shape = {f: int(obj["bert"][f]) for f in SHAPE_FIELDS}
        lowercase, preset, task = bool(obj["lowercase"]), obj.get("preset"), str(obj.get("task", ""))
    except (KeyError, TypeError, ValueError) as e:
        raise FedprivError(f"{path}: malformed BERT tokenizer file ({e})") from None
    vocabulary = obj.get("vocabulary")
    return Tokenizer(WordPieceVocab.from_json(obj["wordpiece"], path), lowercase, shape, preset, task, vocabulary if isinstance(vocabulary, dict) else None)


@dataclass
class Pretrained:
    """A finished BERT run: where it is, its tokenizer and its encoder parameters."""

    run_dir: Path
    tokenizer: Tokenizer
    encoder: Any  # pytree of jax arrays (the "encoder" subtree of the run's final parameters)
    step: int | None
    params: Any = None  # the whole parameter tree (encoder and head), when loaded with full=True


def resolve_run_dir(path: str | os.PathLike[str]) -> Path:
    """``path`` as given when absolute, else relative to the current working directory."""
    p = Path(path).expanduser()
    return p if p.is_absolute() else Path.cwd() / p


def load_pretrained(path: str | os.PathLike[str], full: bool = False) -> Pretrained:
    """Tokenizer and final encoder parameters of the finished BERT run at ``path`` (module docstring);
    with ``full``, the whole parameter tree too (continued masked-LM pretraining)."""
    if not isinstance(path, (str, os.PathLike)) or not str(path):
        raise ConfigError(f"task.options.pretrained: expected the path of a pretraining run directory, got {path!r}")
    if str(path).startswith("run:"):
        raise ConfigError(
            f"task.options.pretrained = {path!r}: 'run:NAME' names a run of an experiment file and works only under "
            "`fedpriv run EXPERIMENT.toml`; here give the run directory's path"
        )
    d = resolve_run_dir(path)
    if not d.is_dir():
        raise ConfigError(
            f"task.options.pretrained: no run directory at {path} (resolved to {d}; relative paths are resolved "
            "against the current directory)"
        )
    tok = load_tokenizer(d)
    params_file = d / PARAMS
    if not params_file.is_file():
        meta = d / CHECKPOINT
        if meta.is_file():
            try:
                step = json.loads(meta.read_text()).get("step")
            except (OSError, ValueError, AttributeError):
                step = "?"
            raise ConfigError(
                f"task.options.pretrained: the run in {d} has a checkpoint at step {step} but did not finish (no "
                f"{PARAMS}); run its `fedpriv train central` command again to finish it"
            )
        raise ConfigError(f"task.options.pretrained: the run in {d} has no checkpoint (no {PARAMS}); did the pretraining run start?")
    try:
        tree = serialization.msgpack_restore(params_file.read_bytes())
    except Exception as e:  # msgpack raises several unrelated types on damaged input
        raise FedprivError(f"{params_file}: unreadable parameters ({type(e).__name__}: {e})") from None
    if not isinstance(tree, dict) or not isinstance(tree.get("encoder"), dict):
        raise FedprivError(f"{params_file}: holds no BERT encoder (no 'encoder' parameters); is {d} a BERT run?")
    encoder = jax.tree_util.tree_map(jnp.asarray, tree["encoder"])
    step = None
    if (d / CHECKPOINT).is_file():
        try:
            step = int(json.loads((d / CHECKPOINT).read_text())["step"])
        except (OSError, ValueError, KeyError, TypeError):
            step = None
    rows = _embedding_rows(encoder)
    if rows != len(tok.wordpiece):
        raise FedprivError(
            f"{d / TOKENIZER} holds {len(tok.wordpiece)} tokens but the encoder in {params_file} embeds {rows}: "
            "the tokenizer is not the vocabulary this model was trained with"
        )
    params = jax.tree_util.tree_map(jnp.asarray, tree) if full else None
    return Pretrained(d, tok, encoder, step, params)


def _embedding_rows(encoder: Any) -> int | None:
    try:
        return int(encoder["token_embed"]["embedding"].shape[0])
    except (KeyError, TypeError, AttributeError, IndexError):
        return None


def check_compatible(pre: Pretrained, cfg: BertConfig, requested: str | BertConfig) -> None:
    """ConfigError unless a model of ``cfg`` can start from ``pre``'s encoder (same shape and vocabulary)."""
    want = shape_of(cfg)
    if want != pre.tokenizer.shape:
        diff = ", ".join(f"{k} {pre.tokenizer.shape[k]} vs {want[k]}" for k in SHAPE_FIELDS if want[k] != pre.tokenizer.shape[k])
        asked = f"task.model = {requested!r}" if isinstance(requested, str) else "the requested BertConfig"
        fix = f"; set task.model = {pre.tokenizer.preset!r}" if pre.tokenizer.preset else ""
        raise ConfigError(
            f"task.options.pretrained: {pre.run_dir} holds BERT {_describe(pre.tokenizer.shape, pre.tokenizer.preset)}, "
            f"but {asked} is {_describe(want, preset_name(cfg))} ({diff}){fix}"
        )
    if cfg.vocab_size != len(pre.tokenizer.wordpiece):
        raise ConfigError(
            f"task.options.pretrained: the model's vocabulary ({cfg.vocab_size} ids) is not the pretrained tokenizer's "
            f"({len(pre.tokenizer.wordpiece)} tokens in {pre.run_dir / TOKENIZER})"
        )
