"""The ``fedpriv`` command.

Every subcommand has ``--help``. Errors fedpriv raises on purpose (bad input, impossible
parameters) are printed as one line ``fedpriv: error: ...`` on stderr, exit code 2; an
unexpected failure prints one line too (exit 1) unless ``FEDPRIV_DEBUG=1`` asks for the traceback.

Every command that takes an experiment config takes ``--set KEY=VALUE`` (repeatable) to change
one of its keys. Known-harmless third-party messages are filtered (:mod:`fedpriv.logs`);
``-v`` (anywhere on the line) shows them.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Optional

import click
import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from fedpriv import __version__
from fedpriv.cli.options import parse_options
from fedpriv.cli.privacy import privacy_app
from fedpriv.cli.privatize import privatize_app
from fedpriv.cli.vocab import vocab_app
from fedpriv.errors import FedprivError
from fedpriv.logs import setup as setup_logs

app = typer.Typer(
    name="fedpriv",
    help="Measure and reduce what language models memorize about the people in their training data.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
data_app = typer.Typer(help="Inspect federated corpora (users -> examples).", no_args_is_help=True)
config_app = typer.Typer(help="Validate experiment configs.", no_args_is_help=True)
train_app = typer.Typer(help="Train models: central (SGD, DP-SGD) or federated (FedAvg, DP-FedAvg).", no_args_is_help=True)
app.add_typer(data_app, name="data")
app.add_typer(config_app, name="config")
app.add_typer(privacy_app, name="privacy")
app.add_typer(train_app, name="train")
app.add_typer(vocab_app, name="vocab")
app.add_typer(privatize_app)  # one command: fedpriv privatize

out = Console()
err = Console(stderr=True)
VERBOSE_FLAGS = ("-v", "--verbose")


def _say(message: str) -> None:
    """A progress line on stderr: one line whatever its length (no wrapping into a log file)."""
    err.print(message, markup=False, highlight=False, soft_wrap=True)


def _set_option():
    return typer.Option([], "--set", help="Override a config key, KEY=VALUE (repeatable; VALUE read as JSON when it parses), e.g. --set training.steps=100.")


_ALLOW_LARGE_DELTA = typer.Option(
    False, "--allow-large-delta", help="Go on even when delta >= 1/N of the privacy unit (refused otherwise: publishing one record in the clear meets such a guarantee); the guarantee is printed with what it means."
)


def _version(value: bool) -> None:
    if value:
        out.print(f"fedpriv {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version and exit."),
    verbose: bool = typer.Option(False, *VERBOSE_FLAGS, help="Show the third-party warnings fedpriv filters as known-harmless (also after a subcommand)."),
) -> None:
    """fedpriv: federated and central training with privacy, canaries and memorization audits."""
    if verbose:
        setup_logs(True)


@data_app.command("inspect")
def data_inspect(
    source: str = typer.Argument(..., help="'shakespeare' (bundled), a path, or a 'synthetic:...' spec."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of tables."),
    format: Optional[str] = typer.Option(None, "--format", help="Override the format guessed from the path."),
    option: list[str] = typer.Option([], "--option", "-o", help="Loader option KEY=VALUE (repeatable), e.g. users=sentences:10."),
    top: int = typer.Option(20, "--top", min=0, help="How many frequent words to list."),
    sample_users: Optional[int] = typer.Option(
        None, "--sample-users", min=1, help="Token statistics over this many sampled users (default: all, or 1,000 above 2M examples)."
    ),
    seed: int = typer.Option(0, "--seed", help="Seed of the user sample."),
) -> None:
    """Print users, examples, tokens, per-user example counts and the most frequent words."""
    from fedpriv.data.inspect import inspect_corpus
    from fedpriv.data.sources import open_corpus, split_format

    format, options = split_format(format, parse_options(option))
    corpus = open_corpus(source, format=format, **options)
    stats = inspect_corpus(corpus, top_words=top, sample_users=sample_users, seed=seed)
    if as_json:
        print(json.dumps(stats, indent=2))
        return
    _print_stats(stats)


def _print_stats(stats: dict) -> None:
    per = stats["examples_per_user"]
    # Text(): file names, notes and words are data, never rich markup ("[deleted]" would vanish)
    t = Table(title=Text(f"{stats['source']} ({stats['kind']})"), show_header=False)
    t.add_row("users", f"{stats['users']:,}")
    t.add_row("examples", f"{stats['examples']:,}")
    scope = "" if stats["token_stats_over_users"] == stats["users"] else f" (over {stats['token_stats_over_users']:,} sampled users)"
    t.add_row("tokens" + scope, f"{stats['tokens']:,}")
    if "tokens_estimated_total" in stats:
        t.add_row("tokens, estimated total", f"{stats['tokens_estimated_total']:,}")
    t.add_row("tokens per example", f"{stats['tokens_per_example']:.1f}")
    t.add_row("distinct words" + scope, f"{stats['distinct_words']:,}")
    t.add_row("examples per user", f"min {per['min']}, median {per['median']:g}, mean {per['mean']:.1f}, max {per['max']}")
    for k, v in stats.get("load", {}).items():
        t.add_row(Text(f"load: {k}"), Text(str(v)))
    for note in stats.get("notes", []):
        t.add_row("note", Text(note))
    for k, v in stats.get("entities", {}).items():
        t.add_row(f"entities: {k}", f"{v:,}")
    out.print(t)
    h = Table(title="users by examples held", min_width=30)
    h.add_column("examples")
    h.add_column("users", justify="right")
    for b in per["histogram"]:
        h.add_row(f"{b['min']}-{b['max']}" if b["max"] > b["min"] else str(b["min"]), f"{b['users']:,}")
    out.print(h)
    if stats["top_words"]:
        w = Table(title="most frequent words", min_width=30)
        w.add_column("word")
        w.add_column("count", justify="right")
        for row in stats["top_words"]:
            w.add_row(Text(row["word"]), f"{row['count']:,}")
        out.print(w)


@config_app.command("check")
def config_check(
    path: Path = typer.Argument(..., readable=False, help="An experiment TOML file."),
    as_json: bool = typer.Option(False, "--json", help="Print the resolved config as JSON."),
    static: bool = typer.Option(False, "--static", help="Check the keys only; do not load the data (cohort and batch sizes, calibration are not checked)."),
    allow_large_delta: bool = _ALLOW_LARGE_DELTA,
    set_: list[str] = _set_option(),
) -> None:
    """Validate an experiment config (or an experiment with [[runs]], every run resolved) with
    the checks training makes before its first step: unknown keys and wrong types by key path,
    impossible privacy, a plug-in task imported, then (unless --static) the data: cohort and batch sizes, delta against
    1/N, the noise calibration."""
    from fedpriv.runner.checks import check_file

    with _naming(path):
        checked = check_file(path, static, overrides=parse_options(set_, "--set"), allow_large_delta=allow_large_delta)
    runs = checked.runs
    for r in runs:
        for w in r.warnings:
            _warn(f"run {r.name!r}: {w}" if checked.experiment else w)
    scope = " (static checks only: data not loaded)" if static else ""
    skipped = [r.name for r in runs if r.skipped]
    if skipped and not static:
        scope = f" (the data of {', '.join(skipped)} is checked when the runs they start from have trained)"
    if checked.experiment:
        if as_json:
            doc: dict = {"name": checked.name, "runs": [r.record for r in runs]}
            if checked.measures:
                doc["measures"] = [m.model_dump() for m in checked.measures]
            print(json.dumps(doc, indent=2))
        else:
            listed = f"; {len(checked.measures)} measurements: {', '.join(m.name for m in checked.measures)}" if checked.measures else ""
            out.print(f"{path}: ok{scope} (experiment {checked.name!r}, {len(runs)} runs: {', '.join(r.name for r in runs)}{listed})", markup=False, highlight=False)
        return
    cfg = runs[0].config
    if as_json:
        print(json.dumps(cfg.model_dump(), indent=2))
    else:
        out.print(f"{path}: ok{scope} (experiment {cfg.name!r}, source {cfg.data.source!r})", markup=False, highlight=False)


@contextmanager
def _naming(path: Path) -> Iterator[None]:
    """Errors inside name ``path`` (the config they come from) unless they already do, or name
    the run directory they are about."""
    from fedpriv.errors import ConfigChanged, RunDirInUse, TrainingDiverged

    try:
        yield
    except (ConfigChanged, TrainingDiverged, RunDirInUse):
        raise
    except FedprivError as e:
        if str(path) in str(e):
            raise
        raise FedprivError(f"{path}: {e}") from None


def _warn(message: str) -> None:
    err.print(f"fedpriv: warning: {message}", markup=False, highlight=False, soft_wrap=True)


_RESTART = typer.Option(False, "--restart", help="Start afresh: remove the run's checkpoint, metrics and parameters first (needed after a config change or a failed run).")


_SECURE = typer.Option(False, "--secure-noise", help="Draw the DP noise and the sampling from a secret that is never stored (FEDPRIV_NOISE_SECRET, hex, or the OS CSPRNG), for a model that is released; resuming needs the same FEDPRIV_NOISE_SECRET. Default: reproducible from the seed (simulation).")


def _private_stats_option():
    return typer.Option(False, "--log-private-stats", help="DP runs: also log statistics epsilon does not cover (realized batch and cohort "
                        "sizes, example counts, delta norms, unnoised loss); the guarantee says so. Same as --set training.log_private_stats=true.")


def _with_private_stats(overrides: dict, on: bool) -> dict:
    """``overrides`` with ``training.log_private_stats = true`` when ``--log-private-stats`` is given."""
    return {**overrides, "training.log_private_stats": True} if on else overrides


def _train(config: Path, kind: str, out_dir: Optional[Path], engine: Optional[str], as_json: bool, stop_after: Optional[int], set_: list[str], restart: bool = False,
           allow_large_delta: bool = False, secure: bool = False, private_stats: bool = False) -> dict:
    """Prepare CONFIG once, train it (``kind``; federated on ``engine``) and build its summary."""
    from fedpriv.config import check_kind, load_config
    from fedpriv.rundir import RunDir, hold
    from fedpriv.runner.dispatch import train_run
    from fedpriv.runner.prepare import prepare
    from fedpriv.runner.summary import train_summary

    say = None if as_json else _say
    cfg = load_config(config, _with_private_stats(parse_options(set_, "--set"), private_stats))
    check_kind(cfg, kind, str(config))
    if secure:
        from fedpriv.training.noise import with_secure_noise

        cfg = with_secure_noise(cfg)
    default = Path("runs") / (cfg.name if kind == "central" else f"{cfg.name}-federated")
    run_dir = out_dir or default
    with hold(run_dir, "run"):  # one process per run directory; a folder that is not a run is refused
        if restart:
            RunDir(run_dir).reset()
        prepared = dataclasses.replace(prepare(cfg, log=say), allow_large_delta=allow_large_delta)
        result = train_run(prepared, run_dir, kind, engine, stop_after, say)
        return train_summary(prepared, kind, run_dir, result, engine)


def _out_option(value: Optional[str]) -> Optional[Path]:
    """An ``--out`` value as a path; the empty string (it would mean the current directory) is refused."""
    if value is None:
        return None
    if not value.strip():
        raise FedprivError("--out '': an empty path names no folder (it would write into the current directory); give a folder")
    return Path(value)


def _print_summary(title: str, summary: dict) -> None:
    t = Table(title=title, show_header=False)
    for k, v in summary.items():
        if isinstance(v, list):
            for item in v:
                t.add_row(k.replace("_", " ").removesuffix("s"), Text(str(item)))
            continue
        t.add_row(k.replace("_", " "), Text(f"{v:,}" if isinstance(v, int) else f"{v:.6g}" if isinstance(v, float) else str(v)))
    out.print(t)


@train_app.command("central")
def train_central_cmd(
    config: Path = typer.Argument(..., readable=False, help="Experiment TOML with [data], [task] and [training]."),
    out: Optional[str] = typer.Option(None, "--out", help="Run directory (default runs/NAME); an existing checkpoint there is resumed; a non-empty folder that is not a fedpriv run is refused."),
    as_json: bool = typer.Option(False, "--json", help="Print the summary as JSON."),
    stop_after: Optional[int] = typer.Option(None, "--stop-after", min=1, help="Stop with a checkpoint after this many steps (resume later)."),
    restart: bool = _RESTART,
    allow_large_delta: bool = _ALLOW_LARGE_DELTA,
    set_: list[str] = _set_option(),
    secure: bool = _SECURE,
    private_stats: bool = _private_stats_option(),
) -> None:
    """Train a model centrally (SGD/momentum/Adam over records, IID or non-IID order)."""
    with _naming(config):
        summary = _train(config, "central", _out_option(out), None, as_json, stop_after, set_, restart, allow_large_delta, secure, private_stats)
    if as_json:
        print(json.dumps(summary, indent=2))
    else:
        _print_summary(f"experiment {summary['experiment']}", summary)


@train_app.command("federated")
def train_federated_cmd(
    config: Path = typer.Argument(..., readable=False, help="Experiment TOML with a [federated] section."),
    engine: Optional[str] = typer.Option(None, "--engine", help="vectorized (in-process JAX) or flower (Flower simulation); default: the config's federated.engine."),
    out: Optional[str] = typer.Option(None, "--out", help="Run directory (default runs/NAME-federated); an existing checkpoint there is resumed; a non-empty folder that is not a fedpriv run is refused."),
    as_json: bool = typer.Option(False, "--json", help="Print the summary as JSON."),
    stop_after: Optional[int] = typer.Option(None, "--stop-after", min=1, help="Stop with a checkpoint after this many rounds (resume later)."),
    restart: bool = _RESTART,
    allow_large_delta: bool = _ALLOW_LARGE_DELTA,
    set_: list[str] = _set_option(),
    secure: bool = _SECURE,
    private_stats: bool = _private_stats_option(),
) -> None:
    """Train federated: sampled users run local SGD, the strategy aggregates their deltas each round."""
    with _naming(config):
        summary = _train(config, "federated", _out_option(out), engine, as_json, stop_after, set_, restart, allow_large_delta, secure, private_stats)
    if as_json:
        print(json.dumps(summary, indent=2))
    else:
        _print_summary(f"experiment {summary['experiment']} ({summary['engine']})", summary)


@app.command("run")
def run_cmd(
    experiment: Path = typer.Argument(..., readable=False, help="Experiment TOML with [[runs]] (see experiments/demo.toml)."),
    out_dir: Optional[str] = typer.Option(None, "--out", help="Run store (default runs/NAME); completed runs there are skipped, an interrupted one resumes; a non-empty folder that is not a fedpriv store is refused."),
    set_: list[str] = typer.Option([], "--set", help="Override an experiment key, KEY=VALUE (repeatable), e.g. --set data.source=Posts.xml."),
    report: bool = typer.Option(True, "--report/--no-report", help="Write the report (fedpriv report STORE) when every run is done."),
    as_json: bool = typer.Option(False, "--json", help="Print the run summaries as JSON."),
    stop_after: Optional[int] = typer.Option(None, "--stop-after", min=1, help="Stop the first run that trains after this many steps or rounds (resume later)."),
    restart: bool = typer.Option(False, "--restart", help="Start runs whose config changed, and failed runs, afresh (finished unchanged runs are kept)."),
    only: Optional[str] = typer.Option(None, "--only", help="Run only these runs, NAME[,NAME] (the others stay as they are in the store)."),
    allow_large_delta: bool = _ALLOW_LARGE_DELTA,
    secure: bool = typer.Option(False, "--secure-noise", help="Every run that adds DP noise draws it, and its sampling, from a secret that is never stored (FEDPRIV_NOISE_SECRET, hex, or the OS CSPRNG); runs without DP noise are unchanged. Default: reproducible from the seed (simulation)."),
    private_stats: bool = _private_stats_option(),
    keep_going: bool = typer.Option(False, "--keep-going", help="A run refused before it trains (e.g. a cohort larger than this corpus's users, or a run it starts from refused) is marked failed with the reason and the other runs go on; the report names it. For pointing an experiment at another corpus. Ends with an error (exit status 2) naming the failed runs, after the report."),
) -> None:
    """Train and audit every run of an experiment (central and federated, one planted corpus)."""
    from fedpriv.runner.store import failures, run_experiment

    say = None if as_json else _say
    names = None if only is None else [n.strip() for n in only.split(",") if n.strip()]
    with _naming(experiment):
        store, summaries, complete = run_experiment(experiment, _out_option(out_dir), _with_private_stats(parse_options(set_, "--set"), private_stats), stop_after, say, restart, names, allow_large_delta, secure, keep_going)
    written = None
    if complete and report:
        from fedpriv.report.tables import write_report

        written = write_report(store)
    if as_json:
        print(json.dumps({"store": str(store), "complete": complete, "runs": summaries, "report": str(written) if written else None}, indent=2))
    elif not complete:
        again = f" --only {only}" if only else ""
        out.print(f"stopped with a checkpoint; run `fedpriv run {experiment}{again}` again to resume ({store})")
    elif written is not None:
        out.print((written / "comparison.md").read_text(), markup=False, highlight=False, soft_wrap=True)
        out.print(f"report: {written}")
    failed = failures(store, _run_names(store))
    if failed:
        listed = "; ".join(f"{n}: {why}" for n, why in failed.items())
        raise FedprivError(f"{store}: {len(failed)} run(s) failed and are left out of the report ({listed}); fix their config and pass --restart")


def _run_names(store: Path) -> list[str]:
    from fedpriv.rundir import read_store_record

    return [r["name"] for r in read_store_record(store)["runs"]]


@app.command("flwr-run")
def flwr_run_cmd(
    app_dir: str = typer.Argument(".", metavar="APP", help="The Flower App directory (this repository)."),
    connection: Optional[str] = typer.Argument(None, help="SuperLink connection in $FLWR_HOME/config.toml (default: Flower's default, `local`)."),
    run_config: list[str] = typer.Option([], "--run-config", "-c", help="Passed to `flwr run` (repeatable), e.g. \"config='experiments/x.toml' run-dir='runs/x'\"."),
    federation_config: list[str] = typer.Option([], "--federation-config", help="Passed to `flwr run` (repeatable), e.g. \"num-supernodes=4 client-resources-num-cpus=1\"."),
    federation: Optional[str] = typer.Option(None, "--federation", help="Passed to `flwr run`."),
    log_dir: Path = typer.Option(Path("runs"), "--log-dir", help="Where the whole streamed log goes, as flwr-run-RUN_ID.log (the terminal gets it without Python tracebacks)."),
) -> None:
    """`flwr run APP [CONNECTION] --stream`, then exit 2 unless the run ended finished:completed
    (`flwr run` itself exits 0 for a failed run). Puts this environment's bin on PATH and turns
    off Flower's runtime dependency installation."""
    from fedpriv.engines.flower.flwr_cli import flwr_run

    flwr_run(app_dir, connection, run_config, federation_config, federation, log_dir=log_dir)


@app.command("report")
def report_cmd(
    store: Path = typer.Argument(..., help="A run store written by fedpriv run."),
    force: bool = typer.Option(False, "--force", help="Write STORE/report/ even when it holds files fedpriv's report did not write."),
) -> None:
    """Write the comparison report of a run store into STORE/report/: Markdown and CSV tables, PNG plots."""
    from fedpriv.report.tables import write_report

    written = write_report(store, force=force)
    out.print((written / "comparison.md").read_text(), markup=False, highlight=False, soft_wrap=True)
    out.print(f"report: {written}")


@app.command("audit")
def audit_cmd(
    run_dir: Path = typer.Argument(..., help="A trained run directory (from fedpriv train) whose experiment has [canaries] (or, with --empirical, [audit] empirical = true)."),
    as_json: bool = typer.Option(False, "--json", help="Print the audit as JSON."),
    candidates: Optional[int] = typer.Option(None, "--candidates", min=1, help="Random Sampling: random suffixes per canary (default: the config's audit.rs_candidates)."),
    empirical: bool = typer.Option(False, "--empirical", help="The empirical privacy audit instead: a lower bound on epsilon from the run's audit canaries (empirical.json)."),
    set_: list[str] = typer.Option([], "--set", help="Override an audit key of the run's config, audit.KEY=VALUE (repeatable), e.g. --set audit.beam_width=10."),
) -> None:
    """Memorization audit: Random Sampling, Beam Search, exposure and extraction (NWP); the
    secret sharer's exposure (masked LM); Random Sampling by the task's loss (plug-in tasks).
    Writes audit.json and audit.md into RUN_DIR. With --empirical: the one-run lower bound on
    epsilon from the audit canaries, beside the accountant's epsilon, into empirical.json."""
    from fedpriv.rundir import hold

    say = None if as_json else _say
    with hold(run_dir, "run", create=False):  # it writes into the run: no trainer may be writing it
        _audit(run_dir, as_json, candidates, empirical, set_, say)


def _audit(run_dir: Path, as_json: bool, candidates: Optional[int], empirical: bool, set_: list[str], say) -> None:
    """:func:`audit_cmd`'s body, under the run directory's lock."""
    from fedpriv.rundir import AUDIT_MD, EMPIRICAL
    from fedpriv.runner.audit import audit_run, empirical_audit

    if empirical:
        report = empirical_audit(run_dir, say)
        if as_json:
            print(json.dumps(report, indent=2))
            return
        _print_summary(f"empirical privacy of {run_dir} (per {report['unit']})", {k: v for k, v in report.items() if k not in ("score",)})
        out.print(f"written: {run_dir / EMPIRICAL}")
        return
    report = audit_run(run_dir, candidates, say, overrides=parse_options(set_, "--set"))
    if as_json:
        print(json.dumps(report, indent=2))
        return
    _print_audit(report)
    out.print(f"written: {run_dir / AUDIT_MD} and audit.json")


# Short headers so the per-canary table fits an 80-column terminal (audit.md has the long names).
AUDIT_HEADERS = {"insertions": "ins.", "rs_memorized": "RS", "rs_rank": "RS rank", "bs_memorized": "BS", "exposure": "exp.", "exposure_extrapolated": "exp. fit",
                 "inserted": "ins.", "exposure_mean": "exp. mean", "exposure_max": "exp. max", "canary_loss": "loss"}


def _print_audit(report: dict) -> None:
    from fedpriv.memorization.audit import canary_table_columns, fmt_value

    cols = canary_table_columns(report["task"])
    t = Table(title=f"canaries ({report['parameters']}; exposure in bits)")
    for c in cols:
        t.add_column(AUDIT_HEADERS.get(c, c.replace("_", " ")), overflow="fold")
    for r in report["canaries"]:
        t.add_row(*(fmt_value(r.get(c)) for c in cols))
    out.print(t)
    s = Table(title="summary by configuration")
    total = report["summary"]["total"]
    keys = list(total)
    labels = [*report["summary"]["by_configuration"], "all"]
    s.add_column("configuration", no_wrap=True, min_width=max(len(n) for n in labels))  # never cut a label
    for k in keys:
        s.add_column(AUDIT_HEADERS.get(k, k.replace("_", " ")), overflow="fold")
    for name, b in [*report["summary"]["by_configuration"].items(), ("all", total)]:
        s.add_row(name, *(fmt_value(b[k]) for k in keys))
    out.print(s)
    for name, m in (report.get("extraction") or {}).items():
        out.print(f"extraction, {name} prefixes: {m['examples']} examples, exact match {fmt_value(m.get('exact_match'))}, token accuracy {fmt_value(m.get('token_accuracy'))}, median edit distance {fmt_value(m.get('median_edit_distance'))}")


@app.command("demo")
def demo(
    config: Path = typer.Option(Path("experiments/demo.toml"), "--config", readable=False, help="Experiment to run."),
    out_dir: Optional[str] = typer.Option(None, "--out", help="Run store (default runs/demo)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of tables."),
    set_: list[str] = _set_option(),
    only: Optional[str] = typer.Option(None, "--only", help="Run only these runs, NAME[,NAME]."),
) -> None:
    """The main job: `fedpriv run experiments/demo.toml` (central against federated memorization
    on the bundled Shakespeare) and its report."""
    run_cmd(config, out_dir, set_, True, as_json, None, False, only, allow_large_delta=False, secure=False, private_stats=False)


def _one_line(message: str) -> str:
    """``message`` with its line breaks escaped (a key or a path may hold one)."""
    return message.replace("\r", "\\r").replace("\n", "\\n")



def _take_verbose(argv: list[str]) -> tuple[list[str], bool]:
    """``argv`` without its ``-v``/``--verbose`` flags (allowed after a subcommand too), and whether it had one."""
    end = argv.index("--") if "--" in argv else len(argv)
    kept = [a for i, a in enumerate(argv) if i >= end or a not in VERBOSE_FLAGS]
    return kept, len(kept) < len(argv)


#: The exit status of a run interrupted by Ctrl-C (SIGINT), as shells report it (128 + 2).
INTERRUPTED = 130
#: The exit status of a run stopped by SIGTERM (a job scheduler, ``kill``, ``timeout``): 128 + 15.
TERMINATED = 143
_sigterm_received = False


def _on_sigterm(signum: int, frame: object) -> None:  # noqa: ARG001
    """SIGTERM stops the command the way Ctrl-C does (an exception where it was: open files are
    closed, temporary spills removed; checkpoints are written atomically, so the same command
    resumes), and :func:`main` says so and exits 143."""
    _note_sigterm()
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a scheduler's second SIGTERM must not cut the cleanup short
    raise KeyboardInterrupt


def _note_sigterm() -> None:
    global _sigterm_received
    _sigterm_received = True


def _interrupted() -> int:
    """Say how the command was stopped, and the exit status that says it too."""
    if _sigterm_received:
        err.print("fedpriv: terminated (SIGTERM); a training run resumes from its last checkpoint when the same command runs again", markup=False, soft_wrap=True)
        return TERMINATED
    err.print("fedpriv: interrupted", markup=False)
    return INTERRUPTED


def main(argv: list[str] | None = None) -> int:
    """Entry point: runs the app and turns every error into one line and an exit code."""
    debug = os.environ.get("FEDPRIV_DEBUG") == "1"
    argv, verbose = _take_verbose(list(sys.argv[1:] if argv is None else argv))
    setup_logs(verbose or None)
    if not debug and not verbose:  # dp-accounting's notes on RDP orders it skips are not the user's to act on
        logging.getLogger("absl").setLevel(logging.ERROR)
    try:
        rv = app(args=argv, standalone_mode=False, prog_name="fedpriv")
        if rv == INTERRUPTED and not isinstance(rv, bool):  # typer turns Ctrl-C into Exit(130), which non-standalone mode returns
            return _interrupted()
        return 0
    except FedprivError as e:
        if debug:
            raise
        err.print(f"fedpriv: error: {_one_line(str(e))}", markup=False, highlight=False, soft_wrap=True)
        return 2
    except click.exceptions.Exit as e:
        return e.exit_code
    except SystemExit as e:  # Ray's SIGTERM handler (a Flower simulation) exits with the signal's number
        if e.code != signal.SIGTERM:
            raise
        _note_sigterm()
        return _interrupted()
    except click.ClickException as e:
        e.show()
        return e.exit_code
    except (click.exceptions.Abort, KeyboardInterrupt):
        return _interrupted()
    except BrokenPipeError:
        return 0
    except OSError as e:  # a path the user gave cannot be read or written (permissions, full disk, not a directory)
        if debug:
            raise
        where = f"{e.filename}: " if e.filename else ""
        err.print(f"fedpriv: error: {_one_line(f'{where}{e.strerror or e}')}", markup=False, highlight=False, soft_wrap=True)
        return 2
    except Exception as e:  # noqa: BLE001 - one line, not a traceback, unless asked
        if debug:
            raise
        msg = f"{type(e).__name__}: {e}".splitlines()[0] if str(e) else type(e).__name__
        err.print(f"fedpriv: internal error: {msg} (set FEDPRIV_DEBUG=1 for the traceback)", markup=False, soft_wrap=True)
        return 1


def console() -> None:
    """The ``fedpriv`` command (and ``python -m fedpriv.cli``): :func:`main`, then exit. Before the
    interpreter shuts down, the objects still alive (a loaded corpus: millions of them at 10^6
    users) are frozen out of the cyclic collector, whose passes at shutdown took 19 s at a million
    users; they are freed by reference counting as before. Only here, never in :func:`main`, which
    tests call in one long process. SIGTERM is handled here too (:func:`_on_sigterm`)."""
    import gc

    signal.signal(signal.SIGTERM, _on_sigterm)
    code = main()
    gc.freeze()
    if code in (INTERRUPTED, TERMINATED):
        # Stopped mid-computation, XLA may still run work the interrupted code dispatched; tearing
        # the runtime down under it aborted the process ("double free", "pure virtual method
        # called": status 134 instead of 130). Run the exit handlers (a spill's folder is removed
        # there), flush, and leave without the interpreter's teardown.
        import atexit

        atexit._run_exitfuncs()
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):  # a closed pipe (| head), a closed stream
                pass
        os._exit(code)
    sys.exit(code)


if __name__ == "__main__":
    console()
