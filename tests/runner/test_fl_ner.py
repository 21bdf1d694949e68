"""experiments/fl-ner.toml: NER under federated learning with DP (Jana and Biemann 2021), issue 9.

The grid: WNUT-17 and NCBI-disease, the BiLSTM tagger with the softmax and the CRF head, and for
each (a) central SGD, (b) central DP-SGD at several noise multipliers, (c) FedAvg, (d) FedAvg with
client-side DP-SGD and (e) DP-FedAvg over n in {2, 5, 10, 15, 20} clients that all take part in
every round. Its report is docs/fl-ner.md and docs/examples/fl-ner/.
"""

import copy
import json
import tomllib
from pathlib import Path

import pytest

from fedpriv.data.conll import iter_sentences
from fedpriv.runner.grid import load_experiment

ROOT = Path(__file__).resolve().parents[2]
EXPERIMENT = ROOT / "experiments" / "fl-ner.toml"
DATASETS = {
    "wnut17": ("tests/data/wnut17/wnut17train.conll", "tests/data/wnut17/emerging.test.annotated"),
    "ncbi": ("tests/data/ncbi-disease/train.tsv", "tests/data/ncbi-disease/test.tsv"),
}
HEADS = ("softmax", "crf")
NS = [2, 5, 10, 15, 20]
NOISE = [0.5, 1.0, 5.0]


def _family(name: str) -> str:
    return name.split("-")[2]


def test_fl_ner_expands_to_both_datasets_both_heads_and_every_family():
    name, specs = load_experiment(EXPERIMENT)
    assert name == "fl-ner"
    by_name = {s.name: s for s in specs}
    assert len(by_name) == len(specs) == 2 * 2 * (1 + len(NOISE) + 3 * len(NS))
    for ds, (train, test) in DATASETS.items():
        n_records = sum(1 for _ in iter_sentences(ROOT / train))
        for head in HEADS:
            mine = [s for s in specs if s.name.startswith(f"{ds}-{head}-")]
            for s in mine:
                c = s.config
                assert (c.data.source, c.data.eval_source) == (train, test)  # entity F1 on the test split
                assert c.data.heldout_fraction == 0.0 and c.task.kind == "ner" and c.task.options["head"] == head
            families: dict[str, list] = {}
            for s in mine:
                families.setdefault(_family(s.name), []).append(s)
            assert set(families) == {"central", "dpsgd", "fedavg", "clientdp", "dpfedavg"}

            # (a) central SGD, not private
            (central,) = families["central"]
            assert central.kind == "central" and central.config.privacy is None and central.config.training.optimizer == "sgd"

            # (b) central DP-SGD: one run per noise multiplier, record-level delta below 1/N
            dpsgd = families["dpsgd"]
            assert all(s.kind == "central" and s.config.privacy is not None for s in dpsgd)
            assert sorted(s.config.privacy.noise_multiplier for s in dpsgd) == NOISE
            assert all(s.config.privacy.delta < 1.0 / n_records for s in dpsgd)

            # (c), (d), (e): n clients (the training sentences dealt round-robin), all n every round
            for family in ("fedavg", "clientdp", "dpfedavg"):
                runs = families[family]
                assert all(s.kind == "federated" for s in runs)
                ns = sorted(s.config.federated.clients_per_round for s in runs)
                assert ns == NS, (ds, head, family, ns)
                for s in runs:
                    f = s.config.federated
                    assert s.name == f"{ds}-{head}-{family}-n{f.clients_per_round}"
                    assert s.config.data.options["users"] == f"clients:{f.clients_per_round}"
                    assert f.sampling == "fixed" and s.config.privacy is None
                    if family == "fedavg":
                        assert f.strategy == "fedavg" and f.client_dp is None
                    elif family == "clientdp":
                        assert f.strategy == "fedavg"
                        assert f.client_dp.clip_norm and f.client_dp.noise_multiplier and f.client_dp.delta < 1.0 / n_records
                    else:
                        assert f.strategy == "dp-fedavg" and f.client_dp is None
                        assert f.clip_norm and f.dp.noise_multiplier and f.dp.delta < 1.0 / f.clients_per_round
    # every run makes the same number of passes over the training data
    passes = {s.config.training.epochs if s.kind == "central" else s.config.federated.rounds * s.config.federated.local_epochs for s in specs}
    assert len(passes) == 1


SHRUNK = ("dpsgd", "clientdp", "dpfedavg")


def _shrunk_overrides() -> dict:
    """The experiment file's own WNUT-17 runs of (b), (d) and (e) (the DP ones, one per privacy
    unit), softmax head, z = 1 and n = 2, with a tiny tagger, short sentences and a few steps."""
    raw = tomllib.loads(EXPERIMENT.read_text())
    runs = []
    for entry in raw["runs"]:
        if not entry["name"].startswith("wnut17-") or _family(entry["name"]) not in SHRUNK:
            continue
        entry = copy.deepcopy(entry)
        entry["grid"] = {k: ([1.0] if k == "privacy.noise_multiplier" else [2] if k == "n" else ["softmax"]) for k in entry["grid"]}
        entry["task"]["options"]["max_len"] = 16  # sentences cut to 16 tokens
        runs.append(entry)
    return {
        "runs": runs,
        "task.options.embed_dim": 8,
        "task.options.hidden": 8,
        "task.options.vocab_size": 300,
        "training.epochs": 0.02,  # 2 steps of 32 of 3394 sentences
        "federated.rounds": 2,
        "federated.max_local_steps": 2,
        "federated.eval_every": 2,
    }


@pytest.mark.slow
def test_fl_ner_shrunk_runs_end_to_end(tmp_path):
    from fedpriv.report.tables import write_report
    from fedpriv.runner.store import run_experiment

    store, summaries, complete = run_experiment(EXPERIMENT, tmp_path / "store", overrides=_shrunk_overrides())
    assert complete
    names = [s["name"] for s in summaries]
    assert names == ["wnut17-softmax-dpsgd-z1.0", "wnut17-softmax-clientdp-n2", "wnut17-softmax-dpfedavg-n2"]
    s = {x["name"]: x for x in summaries}
    assert all(0.0 <= x["eval_f1"] <= 1.0 and x["eval_examples"] == 1287 for x in summaries)  # the whole test split
    assert "example-level" in s["wnut17-softmax-dpsgd-z1.0"]["guarantee"] and s["wnut17-softmax-dpsgd-z1.0"]["epsilon"] > 0
    client = s["wnut17-softmax-clientdp-n2"]
    assert "epsilon" not in client and client["client_epsilon"] > 0 and "record-level" in client["client_guarantee"]
    assert "user-level" in s["wnut17-softmax-dpfedavg-n2"]["guarantee"]
    assert all(s[n]["clients_per_round"] == 2 for n in names[1:])
    runs = json.loads((store / "experiment.json").read_text())["runs"]
    assert [r["config"]["data"]["options"]["users"] for r in runs] == ["clients:1", "clients:2", "clients:2"]
    md = (write_report(store) / "comparison.md").read_text()
    assert "test entity F1 (%)" in md and "| wnut17-softmax-dpfedavg-n2 |" in md
