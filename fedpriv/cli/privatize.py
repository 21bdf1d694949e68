"""``fedpriv privatize SOURCE ...``: write a locally privatized copy of a text corpus.

Every word of every example is replaced by M_txt (nearest token to its noised embedding) or the
Vickrey mechanism, user by user; the result is a JSON Lines table (``user_id``, ``text``, and
``timestamp`` where the source has one) that ``open_corpus(PATH)`` reads back with the same users
and example counts, plus a sidecar ``PATH.privacy.json`` stating the mechanism, its parameters,
the embeddings and the guarantee.

``--mechanism rep`` (M_rep) outputs vectors, not words: every word's embedding plus noise, written
as a NumPy ``.npz`` (see :func:`write_representations`), with the same keys as txt (so M_txt of the
same seed is the nearest word to each vector) and the same sidecar.

Wired into the main CLI with ``app.add_typer(privatize_app)`` (no name: the command is
``privatize`` itself).

Noise: a secret root key from the OS's CSPRNG unless ``--seed`` is given, and nothing that
determines the noise is written beside the output (a reproducible seed, for simulations, is
announced by :data:`SEED_WARNING` on stderr and never stored either).
"""

from __future__ import annotations

import json
import os
import sys
import time
from enum import Enum
from pathlib import Path
from typing import Any, Optional

import typer

from fedpriv.cli.options import parse_options
from fedpriv.errors import FedprivError, PrivacyParameterError
from fedpriv.jsonio import write_bytes_atomic

privatize_app = typer.Typer(help="Local d_chi-privacy: privatize a corpus word by word before it leaves the user.", no_args_is_help=True)

SIDECAR_SUFFIX = ".privacy.json"
SIDECAR_FORMAT = "fedpriv-privatized-corpus"
#: The one line printed when a seed is given for noise that is written out.
SEED_WARNING = "warning: reproducible noise: anyone with the seed can remove it; for simulation only"


class Mech(str, Enum):
    rep = "rep"
    txt = "txt"
    vickrey = "vickrey"


def _say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def sidecar_path(out: str | os.PathLike[str]) -> Path:
    """``privatized.jsonl`` -> ``privatized.privacy.json``."""
    p = Path(out)
    return p.with_name(p.stem + SIDECAR_SUFFIX)


def _written_by_privatize(out: Path) -> bool:
    """Whether ``out`` and its sidecar are a corpus this command wrote (the sidecar, a regular file,
    names ``out``)."""
    side = sidecar_path(out)
    if side.is_symlink() or not side.is_file() or out.is_symlink() or (out.exists() and not out.is_file()):
        return False
    try:
        meta = json.loads(side.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(meta, dict) and meta.get("format") == SIDECAR_FORMAT and meta.get("corpus") == out.name


def check_target(out: Path, force: bool = False) -> None:
    """Refuse to write ``out`` (and its sidecar) into a fedpriv run directory or store, or over
    files this command did not write (unless ``force``)."""
    from fedpriv.rundir import KINDS, marker_kind

    kind = marker_kind(out.parent)
    if kind in ("run", "store"):
        raise FedprivError(f"--out {out}: {out.parent} is a fedpriv {KINDS[kind]}; privatize never writes into one (choose another folder)")
    if force or _written_by_privatize(out):
        return
    for p in (out, sidecar_path(out)):
        if p.exists() or p.is_symlink():
            raise FedprivError(f"--out {out}: {p} exists and was not written by fedpriv privatize; choose another name, or pass --force to replace it")


def check_parameters(mechanism: str, eta: float, t: Optional[float], k: int) -> Optional[float]:
    """Refuse what cannot produce a privatized corpus, before any work; the Vickrey t to use."""
    from fedpriv.privacy.local.mechanisms import check_eta, check_t

    check_eta(eta)
    if mechanism in ("rep", "txt"):
        if t is not None:
            raise PrivacyParameterError(f"--t is the Vickrey tuning parameter: use it with --mechanism vickrey, not {mechanism}")
        return None
    if t is None:
        raise PrivacyParameterError("--mechanism vickrey needs --t in [0, 1] (0 = txt; larger favours the second nearest word)")
    tv = check_t(t)
    if k < 2:
        raise PrivacyParameterError(f"--k must be >= 2 for the Vickrey mechanism, got {k}")
    return tv


def privatize_corpus(
    source: str,
    embeddings: str | os.PathLike[str],
    mechanism: str,
    eta: float,
    out: str | os.PathLike[str],
    t: Optional[float] = None,
    k: int = 2,
    seed: Optional[int] = None,
    format: Optional[str] = None,
    options: Optional[dict[str, Any]] = None,
    max_words: Optional[int] = None,
    batch_tokens: int = 8192,
    progress_every: int = 1000,
    log: Any = None,
    force: bool = False,
) -> dict[str, Any]:
    """Write the privatized corpus and its sidecar; return the sidecar's content.

    Keys (:mod:`fedpriv.privacy.local.corpus`): user number i (in the corpus's user order)
    privatizes with ``fold_in(fold_in(root, PRIVATIZE), i)``, its token j with ``fold_in(that, j)``;
    so a user's output depends only on the root, its position and its own words, not on
    ``batch_tokens``. ``seed`` None: the root is secret (OS CSPRNG, never stored); an int: the
    root is ``key(seed)``, reproducible, for simulations only (a one-line warning says so)."""
    from fedpriv import __version__
    from fedpriv.data.sources import open_corpus, split_format
    from fedpriv.privacy.local.corpus import KEY_SCHEME, NOT_COVERED, SECRET_ROOT, SEEDED_ROOT, new_stats, privatize_users
    from fedpriv.privacy.local.mechanisms import guarantee_note
    from fedpriv.privacy.streams import secret_root
    from fedpriv.runner.embeddings import load_embeddings

    say = log or _say
    tv = check_parameters(mechanism, eta, t, k)
    out = Path(out)
    if mechanism == "rep" and out.suffix.lower() != ".npz":
        raise FedprivError(f"--out {out}: --mechanism rep writes vectors as a NumPy archive; name it *.npz")
    if mechanism != "rep" and out.suffix.lower() != ".jsonl":
        raise FedprivError(f"--out {out}: the privatized corpus is JSON Lines; name it *.jsonl (so open_corpus reads it back)")
    if not out.parent.is_dir():
        raise FedprivError(f"--out {out}: the directory {out.parent} does not exist")
    check_target(out, force)
    src = Path(source)
    if src.exists() and src.resolve() == out.resolve():
        raise FedprivError(f"--out {out} is the source itself")
    if not 1 <= batch_tokens <= 65536 or progress_every < 1:
        raise FedprivError("--batch-tokens must be in [1, 65536] and --progress-every >= 1")

    if seed is not None:
        say(SEED_WARNING)
    root = secret_root() if seed is None else int(seed)
    t0 = time.perf_counter()
    space = load_embeddings(embeddings, max_words, say)
    say(f"embeddings: {space.source}: {len(space):,} rows of dimension {space.dim}, {space.allowed.size:,} words may be output")
    format, options = split_format(format, options or {})
    corpus = open_corpus(source, format=format, **options)
    if corpus.kind != "text":
        raise FedprivError(f"{source}: holds {corpus.kind} (NER) examples; privatize handles text corpora (next-word prediction data)")
    total_users = corpus.num_users
    say(f"privatizing {total_users:,} users of {corpus.name} with {mechanism} at eta = {eta:g}" + (f", t = {tv:g}, k = {k}" if tv is not None else ""))

    stats = new_stats()
    written = 0

    def progress() -> None:
        nonlocal written
        written += 1
        if written % progress_every == 0:
            rate = stats["done"] / max(time.perf_counter() - t0, 1e-9)
            say(f"  {written:,}/{total_users:,} users privatized, {stats['done']:,} tokens ({rate:,.0f} tokens/s)")

    tmp = out.with_name(out.name + ".partial")
    try:
        if tmp.is_symlink() or tmp.is_file():  # a stale partial write (or a link under its name): never followed
            tmp.unlink()
        if mechanism == "rep":
            from fedpriv.privacy.local.corpus import represent_users

            write_representations(tmp, represent_users(corpus.users(), space, eta, root, batch_tokens, stats=stats), space.dim, progress)
        else:
            with open(tmp, "x", encoding="utf-8") as f:
                for u, exs, new in privatize_users(corpus.users(), space, mechanism, eta, tv, k, root, batch_tokens, stats=stats):
                    for ex, words in zip(exs, new):
                        row: dict[str, Any] = {"user_id": u, "text": " ".join(words)}
                        if ex.timestamp is not None:
                            row["timestamp"] = ex.timestamp
                        f.write(json.dumps(row, ensure_ascii=False) + "\n")
                    progress()
        os.replace(tmp, out)
    finally:
        if tmp.exists():
            tmp.unlink()

    seconds = time.perf_counter() - t0
    meta = {
        "format": SIDECAR_FORMAT,
        "version": 1,
        "fedpriv_version": __version__,
        "corpus": str(out.name),
        **({"layout": "vectors float32 (tokens, dim); offsets int64 (examples + 1); example_user int64 (examples,) into users (str)"} if mechanism == "rep" else {}),
        "source": str(source),
        "source_options": options or {},
        "mechanism": mechanism,
        "eta": float(eta),
        "t": tv,
        "k": k if mechanism == "vickrey" else None,
        "noise": SECRET_ROOT if seed is None else SEEDED_ROOT,
        "embeddings": {"spec": str(embeddings), **space.describe()},
        "guarantee": guarantee_note(float(eta), mechanism),
        "keys": KEY_SCHEME,
        "not_covered": NOT_COVERED,
        "users": stats["users"],
        "examples": stats["examples"],
        "tokens": stats["tokens"],
    }
    side = sidecar_path(out)
    write_bytes_atomic(side, json.dumps(meta, indent=1, ensure_ascii=False).encode("utf-8"))
    frac = stats["changed"] / max(1, stats["tokens"])
    changed = "" if mechanism == "rep" else f"{frac:.1%} of tokens changed, "
    say(
        f"wrote {out} ({stats['users']:,} users, {stats['examples']:,} examples, {stats['tokens']:,} tokens; "
        f"{changed}{stats['oov']:,} out-of-vocabulary inputs) and {side} in {seconds:.1f} s"
    )
    return meta


def write_representations(path: str | os.PathLike[str], users: Any, dim: int, progress: Any = None) -> None:
    """Write M_rep output (``(user_id, examples, per-example vectors)`` per user) as an ``.npz``:
    ``vectors`` float32 (tokens, dim); ``offsets`` int64 (examples + 1): example e is
    ``vectors[offsets[e]:offsets[e + 1]]``, one row per word in order; ``example_user`` int64
    (examples,): an index into ``users``, the user ids (str) in corpus order. Timestamps are not
    written. Held in memory until written."""
    import numpy as np

    chunks: list[np.ndarray] = []
    offsets, example_user, user_ids = [0], [], []
    for u, _exs, per_example in users:
        user_ids.append(u)
        for rows in per_example:
            chunks.append(np.asarray(rows, np.float32).reshape(-1, dim))
            offsets.append(offsets[-1] + chunks[-1].shape[0])
            example_user.append(len(user_ids) - 1)
        if progress is not None:
            progress()
    vectors = np.concatenate(chunks) if chunks else np.zeros((0, dim), np.float32)
    with open(path, "wb") as f:
        np.savez(f, vectors=vectors, offsets=np.asarray(offsets, np.int64), example_user=np.asarray(example_user, np.int64), users=np.asarray(user_ids, dtype=str))


@privatize_app.command("privatize")
def privatize_cmd(
    source: str = typer.Argument(..., help="'shakespeare', a path (Posts.xml, *.jsonl, *.csv, ...), or 'synthetic:...'; text corpora only."),
    embeddings: Path = typer.Option(..., "--embeddings", help="A trained NWP run directory, or a GloVe-style text file ('word v1 ... vd' per line)."),
    mechanism: Mech = typer.Option(..., "--mechanism", help="txt: nearest word to the noised embedding (M_txt); vickrey: first or second nearest (Xu et al. 2021); rep: the noised embeddings themselves (M_rep), written as .npz."),
    eta: float = typer.Option(..., "--eta", help="Privacy parameter eta > 0 of eta·d_chi (per token, Euclidean distance between embeddings); smaller = more noise."),
    out: Path = typer.Option(..., "--out", help="Output PATH.jsonl (txt, vickrey) or PATH.npz (rep); the sidecar goes to PATH.privacy.json."),
    t: Optional[float] = typer.Option(None, "--t", help="Vickrey tuning parameter in [0, 1]: P(second) = t·d1 / (t·d1 + (1-t)·d2). Required for vickrey."),
    k: int = typer.Option(2, "--k", help="Vickrey candidates (k nearest words); 2 is Xu et al.'s mechanism."),
    seed: Optional[int] = typer.Option(None, "--seed", help="Reproducible noise from this seed, for simulations only (anyone with the seed can remove the noise; never stored). Default: a secret key from the OS CSPRNG."),
    format: Optional[str] = typer.Option(None, "--format", help="Override the source format guessed from the path."),
    option: list[str] = typer.Option([], "--option", "-o", help="Loader option KEY=VALUE (repeatable), e.g. unit=turn."),
    max_words: Optional[int] = typer.Option(None, "--max-words", min=1, help="GloVe: keep the first N vectors (the most frequent words)."),
    batch_tokens: int = typer.Option(8192, "--batch-tokens", min=1, max=65536, help="Tokens privatized per call (does not change the output)."),
    progress_every: int = typer.Option(1000, "--progress-every", min=1, help="Report progress on stderr every N users."),
    force: bool = typer.Option(False, "--force", help="Replace an existing --out (or its sidecar) that privatize did not write."),
) -> None:
    """Privatize every word of a text corpus with M_txt or the Vickrey mechanism (eta·d_chi per
    token) and write it as JSON Lines that `fedpriv` reads back as a corpus; or with M_rep, the
    noised embeddings, as an .npz."""
    privatize_corpus(
        source,
        embeddings,
        mechanism.value,
        eta,
        out,
        t=t,
        k=k,
        seed=seed,
        format=format,
        options=parse_options(option),
        max_words=max_words,
        batch_tokens=batch_tokens,
        progress_every=progress_every,
        force=force,
    )
