"""experiments/fl-ner.toml: NER under federated learning with DP (Jana and Biemann 2021) on
NCBI-disease, issues 9 and 23.

Central SGD, central DP-SGD, FedAvg on abstract-sized users, FedAvg with client-side DP-SGD and
DP-FedAvg, all with the same BiLSTM-CRF tagger, two seeds. Its report is docs/fl-ner.md and
docs/examples/fl-ner/.
"""

import copy
import csv
import json
import tomllib
from pathlib import Path

import pytest

from fedpriv.data.conll import iter_sentences
from fedpriv.runner.grid import load_experiment

ROOT = Path(__file__).resolve().parents[2]
EXPERIMENT = ROOT / "experiments" / "fl-ner.toml"
TRAIN, TEST = "tests/data/ncbi-disease/train.tsv", "tests/data/ncbi-disease/test.tsv"


def test_fl_ner_expands_to_every_family_with_one_tagger_and_two_seeds():
    name, specs = load_experiment(EXPERIMENT)
    assert name == "fl-ner" and {s.seed for s in specs} == {0, 1}
    groups: dict[str, list] = {}
    for s in specs:
        groups.setdefault(s.group, []).append(s)
    assert set(groups) == {"central", "dpsgd-z1.0", "dpsgd-z3.0", "fedavg-natural", "clientdp-z0.5", "clientdp-z2.0", "dpfedavg-z0.5", "dpfedavg-z1.0"}
    assert all(len(g) == 2 for g in groups.values())
    n_records = sum(1 for _ in iter_sentences(ROOT / TRAIN))
    for s in specs:
        c = s.config
        assert (c.data.source, c.data.eval_source) == (TRAIN, TEST)  # entity F1 on the test split
        assert c.data.options["users"] == "sentences:9" and c.data.heldout_fraction == 0.0
        assert c.task.kind == "ner" and c.task.options == specs[0].config.task.options  # one tagger for every row
        assert c.task.options["head"] == "crf" and c.task.options["char_dim"] > 0
        if s.kind == "federated":
            f = c.federated
            assert f.server_optimizer == "adam" and f.sampling == ("poisson" if f.strategy == "dp-fedavg" else "fixed")
    by = {s.group: s.config for s in specs}
    assert by["central"].privacy is None and by["central"].training.optimizer == "adam"
    for g in ("dpsgd-z1.0", "dpsgd-z3.0"):
        p = by[g].privacy
        assert p.sampling == "poisson" and p.delta < 1.0 / n_records and p.noise_multiplier == float(g.split("-z")[1])
    assert by["fedavg-natural"].federated.strategy == "fedavg" and by["fedavg-natural"].federated.client_dp is None
    for g in ("clientdp-z0.5", "clientdp-z2.0"):
        cd = by[g].federated.client_dp
        assert cd.noise_multiplier == float(g.split("-z")[1]) and cd.delta < 1.0 / n_records
    for g in ("dpfedavg-z0.5", "dpfedavg-z1.0"):
        f = by[g].federated
        assert f.strategy == "dp-fedavg" and f.dp.noise_multiplier == float(g.split("-z")[1]) and f.clip_norm == 1.0
        assert f.dp.delta < 1.0 / 603  # below 1/N for the 603 users (blocks of 9 of 5,424 sentences)


def _shrunk_overrides() -> dict:
    """The experiment file's own runs, one seed, the lowest noise of each DP family, with a tiny
    tagger, short sentences and a few steps."""
    raw = tomllib.loads(EXPERIMENT.read_text())
    runs = []
    for entry in raw["runs"]:
        entry = copy.deepcopy(entry)
        if "grid" in entry:
            entry["grid"] = {k: v[:1] for k, v in entry["grid"].items()}
        runs.append(entry)
    return {
        "runs": runs,
        "seeds": [0],
        "task.options.embed_dim": 8,
        "task.options.hidden": 8,
        "task.options.char_dim": 4,
        "task.options.char_filters": 4,
        "task.options.vocab_size": 300,
        "task.options.max_len": 16,
        "training.epochs": 0.02,
        "federated.rounds": 2,
        "federated.clients_per_round": 4,
        "federated.eval_every": 2,
    }


@pytest.mark.slow
def test_fl_ner_shrunk_runs_end_to_end(tmp_path):
    from fedpriv.report.tables import write_report
    from fedpriv.runner.store import run_experiment

    overrides = _shrunk_overrides()
    for r in overrides["runs"]:  # the DP runs' own sizes, shrunk too
        r.get("training", {}).pop("eval_every", None)
        if "rounds" in r.get("federated", {}):
            r["federated"].update(rounds=2, clients_per_round=8)
        if "batch_size" in r.get("training", {}):
            r["training"]["batch_size"] = 256
    store, summaries, complete = run_experiment(EXPERIMENT, tmp_path / "store", overrides=overrides)
    assert complete
    s = {x["name"]: x for x in summaries}
    assert sorted(s) == sorted(["central-s0", "dpsgd-z1.0-s0", "fedavg-natural-s0", "clientdp-z0.5-s0", "dpfedavg-z0.5-s0"])
    assert all(0.0 <= x["eval_f1"] <= 1.0 and x["eval_examples"] == 940 for x in summaries)  # the whole test split
    assert "example-level" in s["dpsgd-z1.0-s0"]["guarantee"] and s["dpsgd-z1.0-s0"]["epsilon"] > 0
    client = s["clientdp-z0.5-s0"]
    assert "epsilon" not in client and client["client_epsilon"] > 0 and "record-level" in client["client_guarantee"]
    assert "user-level" in s["dpfedavg-z0.5-s0"]["guarantee"] and "Poisson" in s["dpfedavg-z0.5-s0"]["guarantee"]
    runs = json.loads((store / "experiment.json").read_text())["runs"]
    assert {r["config"]["data"]["options"]["users"] for r in runs} == {"sentences:9"}
    report = write_report(store)
    md = (report / "comparison.md").read_text()
    assert "entity F1" in md and "| dpfedavg-z0.5 |" in md
    # a tagger this small, trained for two steps, predicts only O: flagged, never a silent 0.00
    groups = {r["run"]: r for r in csv.DictReader((report / "comparison.csv").open())}
    flagged = [name for name, summary in s.items() if summary.get("degenerate")]
    assert flagged  # at least the tagger trained for two steps
    for name in flagged:
        why = s[name]["degenerate"]
        assert "predicts no entity" in why or "one class" in why
        assert groups[name.rsplit("-s", 1)[0]]["flag"], name
