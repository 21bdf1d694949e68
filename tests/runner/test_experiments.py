"""Experiment grids (``[[runs]]``) and the run store of ``fedpriv run``: expansion, skipping,
resuming an interrupted store to the same results."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from fedpriv.cli import main
from fedpriv.config import validate_config
from fedpriv.errors import ConfigError, FedprivError
from fedpriv.runner.grid import expand_experiment, load_experiment, select_runs
from fedpriv.runner.store import run_experiment

BASE = {
    "name": "grid-test",
    "data": {"source": "shakespeare"},
    "vocab": {"size": 500},
    "task": {"kind": "nwp", "model": "tiny"},
    "training": {"batch_size": 32, "steps": 10},
    "federated": {"rounds": 2, "clients_per_round": 4},
}


def test_grid_expansion_and_merging():
    raw = {
        **BASE,
        "privacy": {"clip_norm": 1.0, "noise_multiplier": 1.0, "delta": 1e-5},
        "runs": [
            {"name": "sgd-{optimizer}-{batch_size}", "kind": "central", "grid": {"training.optimizer": ["sgd", "adam"], "training.batch_size": [8, 16]}},
            {"name": "fedavg", "kind": "federated", "users": "iid", "federated": {"clients_per_round": 7}, "grid": {"federated.rounds": [3, 5]}},
        ],
    }
    specs = expand_experiment(raw)
    assert [s.name for s in specs] == ["sgd-sgd-8", "sgd-sgd-16", "sgd-adam-8", "sgd-adam-16", "fedavg-3", "fedavg-5"]
    central, fed = specs[1], specs[5]
    assert central.kind == "central" and central.config.training.batch_size == 16 and central.config.training.steps == 10
    assert central.config.federated is None and central.config.privacy.clip_norm == 1.0  # the experiment's [privacy]
    assert fed.config.privacy is None and fed.config.data.users == "iid"
    assert fed.config.federated.rounds == 5 and fed.config.federated.clients_per_round == 7
    assert all(s.config.name == "grid-test" for s in specs)  # same held-out users, same canaries


def test_a_grid_variable_sets_several_keys_together():
    raw = {
        **BASE,
        "runs": [
            {
                "name": "fedavg-n{n}",
                "kind": "federated",
                "data": {"options": {"users": "clients:{n}"}},
                "federated": {"clients_per_round": "{n}"},
                "grid": {"n": [2, 5], "federated.rounds": [3]},
            }
        ],
    }
    specs = expand_experiment(raw)
    assert [s.name for s in specs] == ["fedavg-n2", "fedavg-n5"]
    assert [s.config.data.options["users"] for s in specs] == ["clients:2", "clients:5"]
    assert [s.config.federated.clients_per_round for s in specs] == [2, 5]  # "{n}" alone keeps the int
    assert all(s.config.federated.rounds == 3 for s in specs)


@pytest.mark.parametrize(
    "runs, message",
    [
        ([], "at least one"),
        ([{"name": "a", "kind": "central", "epochs": 3}], "unknown key 'epochs'"),
        ([{"name": "a", "kind": "both"}], "kind must be"),
        ([{"name": "a/b", "kind": "central"}], "names a directory"),
        ([{"name": "a", "kind": "central"}, {"name": "a", "kind": "central"}], "two runs are named 'a'"),
        ([{"name": "a-{rate}", "kind": "central", "grid": {"training.batch_size": [1]}}], "not a grid key"),
        ([{"name": "a", "kind": "central", "grid": {"training.batch_size": []}}], "non-empty lists"),
        ([{"name": "a", "kind": "central", "training": {"batch_size": 0}}], "run 'a'.*training.batch_size"),
        ([{"name": "a{lr}", "kind": "central", "grid": {"lr": [0.1]}}], "variable, but no string of the run holds '{lr}'"),
    ],
)
def test_bad_experiments_are_refused_with_the_run_named(runs, message):
    with pytest.raises(ConfigError, match=message):
        expand_experiment({**BASE, "runs": runs})


def test_a_federated_run_needs_a_federated_section():
    raw = {k: v for k, v in BASE.items() if k != "federated"}
    with pytest.raises(ConfigError, match="needs a \\[federated\\] section"):
        expand_experiment({**raw, "runs": [{"name": "f", "kind": "federated"}]})


def test_a_run_level_table_of_the_other_kind_is_refused_not_dropped():
    """A federated run's own privacy table (or a central run's own federated table) used to be
    dropped without a word: the 'private' run trained as plain FedAvg and exited 0."""
    with pytest.raises(ConfigError, match="run 'fed-dp': a federated run takes no privacy table .* federated.dp with strategy = 'dp-fedavg'"):
        expand_experiment({**BASE, "runs": [{"name": "fed-dp", "kind": "federated", "privacy": {"clip_norm": 1.0, "noise_multiplier": 1.0, "delta": 1e-6}}]})
    with pytest.raises(ConfigError, match="run 'sgd': a central run takes no federated table"):
        expand_experiment({**BASE, "runs": [{"name": "sgd", "kind": "central", "federated": {"strategy": "dp-fedavg"}}]})
    # a kind set by the grid: each expansion reads the table of its kind (the other is dropped)
    both = {"privacy": {"clip_norm": 1.0, "noise_multiplier": 1.0, "delta": 1e-5},
            "federated": {"strategy": "dp-fedavg", "rounds": 2, "clients_per_round": 4, "clip_norm": 0.5, "dp": {"noise_multiplier": 1.0, "delta": 1e-3}}}
    gridded = expand_experiment({**BASE, "runs": [{"name": "dp-{kind}", "kind": "central", "grid": {"kind": ["central", "federated"]}, **both}]})
    assert [(s.name, s.kind) for s in gridded] == [("dp-central", "central"), ("dp-federated", "federated")]
    assert gridded[0].config.privacy is not None and gridded[1].config.federated.dp is not None and gridded[1].config.privacy is None
    # the experiment-level tables are shared by design: each run kind reads its own
    specs = expand_experiment({**BASE, "privacy": {"clip_norm": 1.0, "noise_multiplier": 1.0, "delta": 1e-5},
                               "runs": [{"name": "sgd", "kind": "central"}, {"name": "fed", "kind": "federated"}]})
    assert specs[0].config.privacy is not None and specs[0].config.federated is None
    assert specs[1].config.privacy is None and specs[1].config.federated is not None


def test_a_group_named_like_another_runs_seed_is_refused():
    """With seeds, run 'a' gives 'a-s0' and run 'a-s0' gives the group 'a-s0': `--only a-s0`
    picked three runs."""
    with pytest.raises(ConfigError, match=r"run 'a-s0' \(seeds a-s0-sK\) and a seed of another run are both named 'a-s0'"):
        expand_experiment({**BASE, "seeds": [0, 1], "runs": [{"name": "a", "kind": "central"}, {"name": "a-s0", "kind": "central"}]})


def test_shipped_experiments_expand():
    name, specs = load_experiment("experiments/demo.toml")
    assert name == "demo" and len(specs) == 16 and {s.seed for s in specs} == {0, 1} and len({s.group for s in specs}) == 8
    assert all(s.config.utility is not None and s.config.data.validation_fraction > 0 for s in specs)
    assert {s.config.federated.strategy for s in specs if s.kind == "federated"} == {"fedavg", "fedavg-clip", "dp-fedavg"}
    assert {(s.config.training.order, s.config.privacy.unit if s.config.privacy else None) for s in specs if s.kind == "central"} == {("iid", None), ("noniid", None), ("iid", "example"), ("iid", "user")}
    assert {s.config.data.users for s in specs if s.kind == "federated"} == {"iid", "natural"}
    _, full = load_experiment("experiments/thakkar-table1.toml")
    assert len(full) == 18 and sum(c.config.canaries.per_config * 9 == 90 for c in full) == 18
    assert sorted({s.config.federated.clients_per_round for s in full if s.kind == "federated"}) == [500, 1000, 2000, 5000]
    assert sorted({s.config.training.batch_size for s in full if s.kind == "central"}) == [32, 64, 128, 256]
    _, small = load_experiment("experiments/thakkar-table1-small.toml")
    assert list(dict.fromkeys(s.group for s in small)) == [s.name.replace("500", "5").replace("1000", "10").replace("2000", "20").replace("5000", "50") for s in full]
    assert {s.seed for s in small} == {0, 1} and len(small) == 2 * len(full)
    assert all(s.config.utility is not None and s.config.data.validation_fraction > 0 and s.config.data.source == "shakespeare" for s in small)
    assert {s.config.federated.server_optimizer for s in small if s.kind == "federated"} == {"adam"}
    _, se = load_experiment("experiments/stackexchange.toml", {"data.source": "tests/data/stackexchange-coffee/Posts.xml"})
    assert se[0].config.data.source.endswith("Posts.xml") and [s.group for s in se] == [s.group for s in specs]


MINI = """
name = "mini"
seed = 0
[data]
source = "shakespeare"
heldout_fraction = 0.1
[vocab]
size = 500
[task]
kind = "nwp"
model = "tiny"
[training]
optimizer = "adam"
learning_rate = 0.01
batch_size = 32
steps = 40
eval_every = 20
checkpoint_every = 10
[federated]
rounds = 4
clients_per_round = 8
local_batch_size = 16
max_local_steps = 4
client_learning_rate = 0.5
eval_every = 2
[canaries]
per_config = 1
user_probabilities = [0.02]
example_probabilities = [0.1, 0.5]
min_expected_sharers = 0.0
[audit]
rs_candidates = 500
extraction_examples = 20

[[runs]]
name = "fedavg-{users}"
kind = "federated"
grid = { users = ["iid", "natural"] }

[[runs]]
name = "sgd"
kind = "central"

[[runs]]
name = "dp-sgd"
kind = "central"
privacy = { clip_norm = 1.0, noise_multiplier = 1.0, delta = 1e-5 }

[[runs]]
name = "dp-fedavg"
kind = "federated"
federated = { strategy = "dp-fedavg", clip_norm = 0.5, dp = { noise_multiplier = 0.5, delta = 1e-3 } }
"""


def _results(store: Path) -> dict:
    """Everything a store reports except wall-clock times."""
    out = {}
    for run in sorted(p for p in store.iterdir() if p.is_dir() and (p / "summary.json").is_file()):
        s = json.loads((run / "summary.json").read_text())
        s.pop("seconds")
        audit = json.loads((run / "audit.json").read_text())
        out[run.name] = (s, audit["canaries"], audit.get("extraction"), (run / "metrics.jsonl").read_text().replace(" ", ""))
    return out


def _strip_times(metrics: str) -> str:
    return "\n".join(json.dumps({k: v for k, v in json.loads(line).items() if k != "round_seconds"}) for line in metrics.splitlines() if line.strip())


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    root = tmp_path_factory.mktemp("store")
    (root / "mini.toml").write_text(MINI)
    store, summaries, complete = run_experiment(root / "mini.toml", root / "store")
    assert complete and len(summaries) == 5
    return root


@pytest.mark.slow
def test_store_layout_and_skipping(uninterrupted, capsys):
    store = uninterrupted / "store"
    exp = json.loads((store / "experiment.json").read_text())
    assert [r["name"] for r in exp["runs"]] == ["fedavg-iid", "fedavg-natural", "sgd", "dp-sgd", "dp-fedavg"]
    for name in ("sgd", "dp-sgd", "fedavg-iid", "fedavg-natural", "dp-fedavg"):
        files = {p.name for p in (store / name).iterdir()}
        assert {"run-config.json", "config.json", "metrics.jsonl", "params.msgpack", "canaries.json", "audit.json", "audit.md", "summary.json"} <= files
    assert {"privacy_ledger.json"} <= {p.name for p in (store / "dp-sgd").iterdir()}
    sums = {n: json.loads((store / n / "summary.json").read_text()) for n in ("sgd", "dp-sgd", "fedavg-natural", "dp-fedavg")}
    assert sums["sgd"]["algorithm"] == "SGD" and "epsilon" not in sums["sgd"]
    assert sums["dp-sgd"]["algorithm"] == "DP-SGD" and "example-level" in sums["dp-sgd"]["guarantee"]
    assert sums["dp-fedavg"]["algorithm"] == "DP-FedAvg" and "user-level" in sums["dp-fedavg"]["guarantee"]
    # every run saw the same planted canaries
    manifests = {(store / n / "canaries.json").read_text() for n in sums}
    assert len(manifests) == 1
    # a second run of the same command skips every run
    before = _results(store)
    assert main(["run", str(uninterrupted / "mini.toml"), "--out", str(store), "--json", "--no-report"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["complete"] and [r["name"] for r in out["runs"]] == ["fedavg-iid", "fedavg-natural", "sgd", "dp-sgd", "dp-fedavg"]
    assert _results(store) == before


@pytest.mark.slow
def test_an_interrupted_store_resumes_to_the_same_results(uninterrupted, tmp_path):
    """Stopped mid-way in a federated run, then in a central run, then finished: the same numbers
    (summaries, audits, metrics) as the uninterrupted store."""
    exp = uninterrupted / "mini.toml"
    store = tmp_path / "store"
    _, done, complete = run_experiment(exp, store, stop_after=2)  # fedavg-iid stops at round 2 of 4
    assert not complete and done == []
    assert json.loads((store / "fedavg-iid" / "checkpoint.json").read_text())["step"] == 2
    # fedavg-iid resumes and ends (2 more rounds), fedavg-natural ends (4 < 20), sgd stops at step 20 of 40
    _, done, complete = run_experiment(exp, store, stop_after=20)
    assert not complete and [s["name"] for s in done] == ["fedavg-iid", "fedavg-natural"]
    assert json.loads((store / "sgd" / "checkpoint.json").read_text())["step"] == 20
    _, done, complete = run_experiment(exp, store)
    assert complete and len(done) == 5
    got, want = _results(store), _results(uninterrupted / "store")
    assert got.keys() == want.keys()
    for name in want:
        assert got[name][:3] == want[name][:3], name
        assert _strip_times(got[name][3]) == _strip_times(want[name][3]), name
    # and so the same comparison table
    from fedpriv.report.tables import write_report

    assert (write_report(store) / "comparison.csv").read_text() == (write_report(uninterrupted / "store") / "comparison.csv").read_text()


@pytest.mark.slow
def test_a_store_refuses_a_changed_run_or_another_experiment(uninterrupted, tmp_path):
    store = uninterrupted / "store"
    changed = tmp_path / "mini.toml"
    changed.write_text(MINI.replace("steps = 40", "steps = 50"))
    with pytest.raises(FedprivError, match="config changed"):
        run_experiment(changed, store)
    other = tmp_path / "other.toml"
    other.write_text(MINI.replace('name = "mini"', 'name = "other"'))
    with pytest.raises(FedprivError, match="holds experiment 'mini'"):
        run_experiment(other, store)


def test_a_store_written_before_a_schema_addition_still_matches(tmp_path):
    """Keys a newer schema adds with their defaults (e.g. ``privatize``) do not count as a change."""
    from fedpriv.runner.store import check_store

    exp = tmp_path / "mini.toml"
    exp.write_text(MINI)
    name, specs = load_experiment(exp)
    old = [{"name": s.name, "kind": s.kind, "config": {k: v for k, v in s.raw.items() if k != "privatize"}} for s in specs]
    (tmp_path / "store" / specs[0].name).mkdir(parents=True)
    (tmp_path / "store" / "experiment.json").write_text(json.dumps({"name": name, "runs": old}))
    check_store(tmp_path / "store", name, specs)  # accepted
    old[0]["config"]["training"]["steps"] += 1
    (tmp_path / "store" / "experiment.json").write_text(json.dumps({"name": name, "runs": old}))
    with pytest.raises(FedprivError, match="config changed"):
        check_store(tmp_path / "store", name, specs)


def test_a_revalidated_run_keeps_which_keys_were_given(tmp_path):
    """Resolving "run:NAME" and building a tuning trial re-validate a run's config from its full
    dump: a correlated-noise run that leaves `sampling` out gets the cyclic schedule, written into
    the config, so the dump is not read as asking for Poisson sampling."""
    from fedpriv.runner.grid import resolve_run_refs
    from fedpriv.runner.tune import trial_config

    privacy = {"unit": "user", "clip_norm": 1.0, "mechanism": "blt", "noise_multiplier": 2.0, "delta": 1e-5}
    runs = [
        {"name": "public", "kind": "central"},
        {"name": "blt", "kind": "central", "init": {"from": "run:public"}, "privacy": privacy,
         "tune": {"training.learning_rate": [0.01, 0.1]}},
    ]
    _, blt = expand_experiment({**BASE, "data": {"source": "shakespeare", "validation_fraction": 0.1}, "runs": runs})
    resolved = resolve_run_refs(blt, tmp_path)
    assert resolved.config.init.from_ == str((tmp_path / "public").resolve())
    assert resolved.config.privacy.mechanism == "blt" and resolved.config.privacy.sampling == "cyclic"
    assert validate_config(resolved.raw).privacy.sampling == "cyclic"  # as a run's config.json is read back
    trial = validate_config(trial_config(resolved.raw, {"training.learning_rate": 0.1}, resolved.tune_fraction, resolved.kind))
    assert trial.training.learning_rate == 0.1 and trial.privacy.mechanism == "blt"
    assert trial.training.steps == math.ceil(10 * blt.tune_fraction)  # BASE trains 10 steps
    fed = {"strategy": "dp-fedavg", "clip_norm": 1.0, "rounds": 2, "clients_per_round": 4, "dp": {"mechanism": "blt", "noise_multiplier": 2.0, "delta": 1e-5}}
    cfg = validate_config({**BASE, "federated": fed})
    assert cfg.federated.sampling == "cyclic" and validate_config(cfg.model_dump()).federated.sampling == "cyclic"
    with pytest.raises(ConfigError, match="not 'fixed' sampling"):
        validate_config({**BASE, "federated": {**fed, "sampling": "fixed"}})


def test_privatize_embeddings_may_name_an_earlier_run(tmp_path):
    from fedpriv.runner.grid import resolve_run_refs

    runs = [
        {"name": "base", "kind": "central"},
        {"name": "txt", "kind": "central", "privatize": {"mechanism": "txt", "eta": 8.0, "embeddings": "run:base"}},
    ]
    base, txt = expand_experiment({**BASE, "runs": runs})
    assert resolve_run_refs(txt, tmp_path).config.privatize.embeddings == str((tmp_path / "base").resolve())
    with pytest.raises(ConfigError, match="privatize.embeddings = 'run:base' names no earlier run"):
        expand_experiment({**BASE, "runs": runs[::-1]})


NER_GRID = """
name = "ner-grid"
seed = 0
[data]
source = "tests/data/wnut17/wnut17train.conll"
options = { users = "clients:5" }
heldout_fraction = 0.0
eval_source = "tests/data/wnut17/emerging.dev.conll"
eval_options = { users = "sentences:50" }
[task]
kind = "ner"
options = { head = "softmax", embed_dim = 16, hidden = 16, char_dim = 0 }
[training]
batch_size = 32
steps = 8
eval_every = 8
checkpoint_every = 8
[federated]
rounds = 2
clients_per_round = 5
local_batch_size = 32
max_local_steps = 2
client_learning_rate = 0.5
eval_every = 2

[[runs]]
name = "central"
kind = "central"

[[runs]]
name = "fedavg-{users}"
kind = "federated"
grid = { "data.options.users" = ["clients:5"] }

[[runs]]
name = "fedavg-2"
kind = "federated"
data = { options = { users = "clients:2" } }
federated = { clients_per_round = 2 }

[[runs]]
name = "fedavg-client-dp"
kind = "federated"
federated = { client_dp = { clip_norm = 1.0, noise_multiplier = 1.0, delta = 1e-5 } }

[[runs]]
name = "dp-fedavg"
kind = "federated"
federated = { strategy = "dp-fedavg", clip_norm = 0.5, dp = { noise_multiplier = 1.0, delta = 0.01 } }
"""


@pytest.mark.slow
def test_a_ner_grid_over_n_clients_reports_entity_f1(tmp_path):
    """NER under FL (Jana and Biemann 2021): per-run data overrides (2 or 5 clients), client-side
    DP-SGD and DP-FedAvg through the same runner; no canaries, so no audit; F1 in the report."""
    from fedpriv.report.tables import write_report

    exp = tmp_path / "ner.toml"
    exp.write_text(NER_GRID)
    store, summaries, complete = run_experiment(exp, tmp_path / "store")
    assert complete and [s["name"] for s in summaries] == ["central", "fedavg-clients5", "fedavg-2", "fedavg-client-dp", "dp-fedavg"]
    assert all("audit" not in s and 0.0 <= s["eval_f1"] <= 1.0 for s in summaries)
    assert "user-level" in summaries[-1]["guarantee"]
    client_dp = summaries[3]
    assert "epsilon" not in client_dp and client_dp["client_epsilon"] > 0 and "record-level" in client_dp["client_guarantee"]
    exp_json = json.loads((store / "experiment.json").read_text())
    assert [r["config"]["data"]["options"]["users"] for r in exp_json["runs"]] == ["clients:5", "clients:5", "clients:2", "clients:5", "clients:5"]
    assert json.loads((store / "fedavg-2" / "summary.json").read_text())["clients_per_round"] == 2
    md = (write_report(store) / "comparison.md").read_text()
    assert "test entity F1 (%)" in md and "| dp-fedavg |" in md
    client_row = next(line for line in md.splitlines() if line.startswith("| fedavg-client-dp |"))
    cells = [c.strip() for c in client_row.split("|")]
    assert "record-level" in client_row and "not private" not in cells and "∞" not in cells  # a private row (its unit and epsilon)
    assert "not covered by ε: vocabulary not private" in client_row  # its word vocabulary is not (issue 30)


def test_only_selects_runs_in_experiment_order_with_what_they_start_from():
    raw = {
        "name": "chain",
        "data": {"source": "tests/data/ncbi-disease/train.tsv"},
        "task": {"kind": "mlm", "model": "tiny"},
        "training": {"steps": 1},
        "runs": [
            {"name": "pre", "kind": "central"},
            {"name": "ft", "kind": "central", "task": {"kind": "bert-ner", "options": {"pretrained": "run:pre"}}},
            {"name": "other", "kind": "central"},
        ],
    }
    specs = expand_experiment(raw)
    assert select_runs(specs, None) == specs
    assert [s.name for s in select_runs(specs, ["other", "pre"])] == ["pre", "other"]
    assert [s.name for s in select_runs(specs, ["ft", "pre"])] == ["pre", "ft"]
    with pytest.raises(ConfigError, match=r"--only: run 'ft' starts from run 'pre' \(task.options.pretrained\), which is neither in --only nor finished"):
        select_runs(specs, ["ft"])
    assert [s.name for s in select_runs(specs, ["ft"], finished=lambda name: name == "pre")] == ["ft"]
    with pytest.raises(ConfigError, match="no run named 'fine'; the runs are pre, ft, other"):
        select_runs(specs, ["fine"])


KEEP_GOING = """
name = "kg"
seed = 0
[data]
source = "synthetic:users=30,examples=600"
heldout_fraction = 0.1
[vocab]
size = 60
seq_len = 8
[task]
kind = "nwp"
model = "tiny"
[training]
batch_size = 16
steps = 4
eval_every = 2
[federated]
rounds = 2
clients_per_round = 5
local_batch_size = 4
max_local_steps = 1
[audit]
rs_candidates = 50
extraction_examples = 0

[[runs]]
name = "too-big"
kind = "federated"
federated = { clients_per_round = 1000 }

[[runs]]
name = "after-too-big"
kind = "central"
init = { from = "run:too-big" }

[[runs]]
name = "sgd"
kind = "central"
"""


@pytest.mark.slow
def test_keep_going_marks_refused_runs_and_trains_the_others(tmp_path, capsys):
    """Pointed at a corpus too small for one row, --keep-going refuses that row (and the row that
    starts from it) with the reason and trains the rest; the report names them; exit status 2 (an error naming them).
    Without it, the first refusal stops the grid before any run trains."""
    (tmp_path / "kg.toml").write_text(KEEP_GOING)
    with pytest.raises(FedprivError, match="clients_per_round = 1000 exceeds the 29 training users"):
        run_experiment(tmp_path / "kg.toml", tmp_path / "strict")
    assert not (tmp_path / "strict" / "sgd" / "summary.json").exists()
    assert main(["run", str(tmp_path / "kg.toml"), "--out", str(tmp_path / "store"), "--keep-going"]) == 2
    err = capsys.readouterr().err
    assert "2 run(s) failed and are left out of the report" in err
    store = tmp_path / "store"
    why = {n: json.loads((store / n / "failed.json").read_text())["reason"] for n in ("too-big", "after-too-big")}
    assert why["too-big"].startswith("refused before training:") and "exceeds the 29 training users" in why["too-big"]
    assert why["after-too-big"].startswith("refused before training:") and "too-big" in why["after-too-big"]
    assert (store / "sgd" / "summary.json").is_file()
    md = (store / "report" / "comparison.md").read_text()
    assert "Run too-big failed and is not compared: refused before training:" in md and "| sgd |" in md
    # --only a run whose start failed: refused up front without --keep-going, settled with it
    with pytest.raises(FedprivError, match="starts from run 'too-big'"):
        run_experiment(tmp_path / "kg.toml", store, only=["after-too-big"])
    assert run_experiment(tmp_path / "kg.toml", store, only=["after-too-big"], keep_going=True)[2]


def test_keep_going_still_stops_at_an_error_in_the_data_itself(tmp_path):
    """A missing column fails every run alike: --keep-going stops there instead of marking each run failed."""
    (tmp_path / "c.jsonl").write_text('{"who": "a", "body": "one two three"}\n')
    (tmp_path / "kg.toml").write_text(KEEP_GOING.replace('source = "synthetic:users=30,examples=600"', f'source = "{tmp_path / "c.jsonl"}"\noptions = {{ user_column = "who", text_column = "text" }}'))
    with pytest.raises(FedprivError, match="missing column 'text'"):
        run_experiment(tmp_path / "kg.toml", tmp_path / "store", keep_going=True)
    assert not list((tmp_path / "store").glob("*/failed.json"))


@pytest.mark.slow
def test_keep_going_leaves_a_run_that_trained_to_resume(tmp_path):
    """A run refused after it trained (here its data shrank under its cohort between a kill and the
    resume) keeps its checkpoint, is not marked failed, and the grid ends incomplete."""
    def write(users):
        rows = [json.dumps({"who": f"u{u}", "text": f"word{k} alpha beta gamma delta {u % 7} end"}) for u in range(users) for k in range(6)]
        (tmp_path / "d.jsonl").write_text("\n".join(rows) + "\n")

    write(30)
    (tmp_path / "e.toml").write_text(f'name = "kgr"\n[data]\nsource = "{tmp_path / "d.jsonl"}"\noptions = {{ user_column = "who", text_column = "text" }}\n'
                                     'heldout_fraction = 0.1\n[vocab]\nsize = 30\nseq_len = 6\n[task]\nkind = "nwp"\nmodel = "tiny"\n'
                                     '[federated]\nrounds = 3\nclients_per_round = 10\nlocal_batch_size = 2\nmax_local_steps = 1\ncheckpoint_every = 1\n'
                                     '[audit]\nrs_candidates = 20\nextraction_examples = 0\n[[runs]]\nname = "fed"\nkind = "federated"\n')
    assert run_experiment(tmp_path / "e.toml", tmp_path / "s", stop_after=1)[2] is False
    write(8)
    assert run_experiment(tmp_path / "e.toml", tmp_path / "s", keep_going=True)[2] is False
    assert (tmp_path / "s" / "fed" / "checkpoint.json").is_file() and not (tmp_path / "s" / "fed" / "failed.json").exists()
