"""The DP-BERT chain (Hoory et al. 2021): a vocabulary from a private corpus (plain or DP),
continued masked-LM pretraining from an earlier run, run references in experiments, and the
composition of the chain's privacy in the report."""

from __future__ import annotations

import json
import math
import string
from pathlib import Path

import jax
import numpy as np
import pytest

from fedpriv.config import validate_config
from fedpriv.errors import ConfigError, FedprivError
from fedpriv.report.chain import NOT_COMPOSED, NOT_PRIVATE, NOT_USED, Stage, chain_stages, compose, training_stage, vocabulary_stage
from fedpriv.runner.grid import expand_experiment, load_experiment, resolve_run_refs
from fedpriv.tasks.bert_run import load_pretrained
from fedpriv.vocab.build import build_vocab, public_alphabet
from fedpriv.vocab.dp_histogram import corollary1_sigma
from fedpriv.vocab.wordpiece import learn_wordpiece

NCBI = "tests/data/ncbi-disease/train.tsv"


# ---- vocabulary ----------------------------------------------------------------------------------
def test_a_public_alphabet_spells_every_word_of_a_tiny_histogram():
    counts = {"the": 50.0, "of": 40.0}
    plain = learn_wordpiece(counts, 60)
    assert plain.tokenize_word("zebra") == ("[UNK]",)  # z, e, b, r, a were never seen
    chars = public_alphabet("ascii", lowercase=True)
    vocab = learn_wordpiece(counts, 300, alphabet=chars)
    assert all(c in vocab and "##" + c in vocab for c in string.ascii_lowercase + string.digits)
    assert "[UNK]" not in vocab.tokenize_word("zebra-42") and "the" in vocab
    assert len(chars) == len(set(chars)) == 26 + 10 + len(string.punctuation)
    with pytest.raises(FedprivError, match="room for"):
        learn_wordpiece(counts, 60, alphabet=chars)
    with pytest.raises(FedprivError, match="single non-space"):
        learn_wordpiece(counts, 60, alphabet=["ab"])


def test_build_vocab_lowercases_and_records_the_longest_example(tmp_path):
    rep = build_vocab(NCBI, "wordpiece", 500, out_dir=tmp_path / "v", lowercase=True, alphabet="ascii", source_options={"users": "sentences:10"})
    tokens = (tmp_path / "v" / "vocab.txt").read_text().split()
    assert not any(t.isupper() for t in tokens if not t.startswith("[")) and rep["lowercase"] and rep["alphabet"] == "ascii"
    assert rep["longest_example_words"] == 123  # NCBI-disease's longest training sentence, in words
    with pytest.raises(FedprivError, match="WordPiece"):
        build_vocab(NCBI, "word", 50, out_dir=tmp_path / "w", alphabet="ascii")


def test_vocab_dp_parameters_are_refused_at_validation():
    with pytest.raises(ConfigError, match="epsilon must be in \\(0, 1\\)"):
        validate_config({"name": "x", "vocab": {"dp": "gaussian", "epsilon": 2.0}})
    with pytest.raises(ConfigError, match="without a DP mechanism"):
        validate_config({"name": "x", "vocab": {"epsilon": 0.5}})
    v = validate_config({"name": "x", "vocab": {"dp": "gaussian", "epsilon": 0.5, "delta": 1e-6}}).vocab
    assert v.custom and v.tuple_size == 256 and v.partition == "example"
    assert not validate_config({"name": "x"}).vocab.custom


# ---- composition -----------------------------------------------------------------------------------
def _vocab_record(eps=0.5, partition="example", longest=123, mechanism="gaussian"):
    return {"source": NCBI, "dp": {"mechanism": mechanism, "epsilon": eps, "delta": 1e-6, "partition": partition, "tuple_size": 256, "guarantee": "g"},
            "longest_example_words": longest}


def _summaries(vocab=None, eps=1.0, sampling="poisson"):
    return {
        "pub": {"name": "pub", "kind": "central", "task": "mlm", "data_source": "shakespeare", "vocabulary": vocab or _vocab_record()},
        "dp": {"name": "dp", "kind": "central", "task": "mlm", "data_source": NCBI, "starts_from": {"pretrained": "pub"},
               "epsilon": eps, "delta": 1e-6, "sampling": sampling, "guarantee": "dp-sgd", "privacy_unit": "example"},
        "ner": {"name": "ner", "kind": "central", "task": "bert-ner", "data_source": "tests/data/wnut17/wnut17train.conll", "starts_from": {"pretrained": "dp"}},
    }


def test_a_dp_vocabulary_and_dp_sgd_compose_by_adding_epsilons_and_deltas():
    s = _summaries()
    stages = chain_stages("ner", s)
    assert [(st.what, st.run) for st in stages] == [("vocabulary", "pub"), ("mlm", "pub"), ("mlm", "dp"), ("bert-ner", "ner")]
    c = compose(chain_stages("dp", s), NCBI)
    assert c["status"] == "private" and c["epsilon"] == 1.5 and c["delta"] == 2e-6
    assert compose(stages, "tests/data/ncbi-disease/../ncbi-disease/train.tsv")["epsilon"] == 1.5  # paths normalised
    assert compose(stages, "tests/data/wnut17/wnut17train.conll")["status"] == NOT_PRIVATE  # fine-tuning without DP
    assert compose(chain_stages("pub", s), "tests/data/wnut17/wnut17train.conll")["status"] == NOT_USED


@pytest.mark.parametrize(
    "vocab, sampling, why",
    [
        (_vocab_record(partition="stream"), "poisson", "vocabulary"),  # a tuple may span two examples
        (_vocab_record(longest=300), "poisson", "vocabulary"),  # an example of 300 words is two tuples
        (_vocab_record(), "fixed", "mlm"),  # fixed-size batches: replace-one, not add-or-remove
    ],
)
def test_guarantees_about_another_relation_are_not_composed(vocab, sampling, why):
    c = compose(chain_stages("dp", _summaries(vocab, sampling=sampling)), NCBI)
    assert c["status"] == NOT_COMPOSED and c["epsilon"] is None and c["why"].startswith(why)


def test_a_non_private_stage_makes_the_chain_not_private_and_loops_are_refused():
    s = _summaries(vocab={"source": NCBI, "dp": None})
    c = compose(chain_stages("dp", s), NCBI)
    assert c["status"] == NOT_PRIVATE and "vocabulary (pub) reads it without DP" in c["why"]
    s["pub"]["starts_from"] = {"pretrained": "dp"}
    with pytest.raises(ValueError, match="loops"):
        chain_stages("ner", s)


def test_stage_composability_follows_the_recorded_guarantee():
    assert vocabulary_stage("v", _vocab_record()).composable
    assert not vocabulary_stage("v", _vocab_record(mechanism="count")).composable
    assert training_stage({"name": "f", "kind": "federated", "task": "mlm", "epsilon": 2.0, "delta": 1e-5, "guarantee": "user-level"}) == Stage(
        "f", "mlm", "?", 2.0, 1e-5, "user-level", False
    )


# ---- run references ---------------------------------------------------------------------------------
BASE = {"name": "chain", "seed": 0, "task": {"kind": "mlm", "model": "tiny"}, "training": {"steps": 2}}


def test_run_references_must_name_an_earlier_run(tmp_path):
    later = [{"name": "b", "kind": "central", "task": {"options": {"pretrained": "run:a"}}}, {"name": "a", "kind": "central"}]
    with pytest.raises(ConfigError, match="'run:a' names no earlier run \\(it comes later"):
        expand_experiment({**BASE, "runs": later})
    with pytest.raises(ConfigError, match="names no earlier run$"):
        expand_experiment({**BASE, "runs": [{"name": "b", "kind": "central", "task": {"options": {"pretrained": "run:zz"}}}]})
    a, b = expand_experiment({**BASE, "runs": later[::-1]})
    assert resolve_run_refs(a, tmp_path) is a
    assert resolve_run_refs(b, tmp_path).config.task.options["pretrained"] == str((tmp_path / "a").resolve())
    with pytest.raises(ConfigError, match="works only under `fedpriv run"):
        load_pretrained("run:a")


def test_a_run_starting_from_another_cannot_set_its_own_vocabulary():
    from fedpriv.data.corpus import FederatedCorpus
    from fedpriv.data.examples import TextExample
    from fedpriv.tasks.registry import build_task

    cfg = validate_config({**BASE, "vocab": {"source": NCBI}, "task": {"kind": "mlm", "model": "tiny", "options": {"pretrained": "/nonexistent"}}})
    with pytest.raises(ConfigError, match="uses; set the vocabulary in the run that learned it"):
        build_task(cfg, FederatedCorpus.from_dict({"u": [TextExample("a b c")]}, "t"))


def test_shipped_dp_bert_experiment_expands_to_the_papers_table():
    _, specs = load_experiment("experiments/dp-bert.toml")
    by = {s.name: s.config for s in specs}
    assert {s.config.seed for s in specs} == {0, 1} and len(specs) == 2 * 15  # two seeds, the whole chain each
    for seed in (0, 1):
        dp_vocab, ext_vocab = by[f"public-bert-dp-vocab-s{seed}"].vocab, by[f"public-bert-extended-vocab-s{seed}"].vocab
        assert dp_vocab.dp == ext_vocab.dp == "gaussian" and dp_vocab.tuple_size == ext_vocab.tuple_size == 256
        assert dp_vocab.public is None and ext_vocab.public == "shakespeare"  # the paper's DP vocabulary, and the public one extended
        assert dp_vocab.source == ext_vocab.source == by[f"dp-eps1.0-s{seed}"].data.source == NCBI
        dp_runs = [f"{p}-eps{e}-s{seed}" for p in ("dp", "dp-extended") for e in ("1.0", "8.0")]
        assert {by[n].privacy.target_epsilon for n in dp_runs} == {1.0, 8.0}
        assert all(by[n].privacy.sampling == "poisson" for n in dp_runs)
        assert set(by[f"nonprivate-s{seed}"].canaries.patterns) == {"HS", "HSH", "HHSHH"}
    tuned = [s for s in specs if s.config.task.kind == "bert-ner"]
    assert {s.config.task.options["pretrained"] for s in tuned} == {
        f"run:{e}-s{seed}" for seed in (0, 1) for e in ("public", "nonprivate", "dp-eps1.0", "dp-eps8.0", "dp-extended-eps1.0", "dp-extended-eps8.0")}
    # every tagger is fine-tuned and scored alike: the same data, recipe and length limit
    assert {(s.config.data.source, s.config.data.eval_source, s.config.task.options["max_len"], s.config.training.learning_rate,
             s.config.training.steps) for s in tuned} == {(NCBI, "tests/data/ncbi-disease/test.tsv", 128, tuned[0].config.training.learning_rate,
                                                          tuned[0].config.training.steps)}


# ---- end to end -------------------------------------------------------------------------------------------
CHAIN = f"""
name = "tiny-chain"
seed = 0
[data]
source = "shakespeare"
heldout_fraction = 0.1
[task]
kind = "mlm"
model = "tiny"
[training]
optimizer = "adam"
learning_rate = 0.002
batch_size = 16
steps = 4
eval_every = 4
checkpoint_every = 4
eval_batch_size = 64

[[runs]]
name = "public-dp-vocab"
kind = "central"
data = {{ max_examples_per_user = 20 }}
vocab = {{ size = 400, alphabet = "ascii", source = "{NCBI}", source_options = {{ users = "sentences:10" }}, dp = "gaussian", epsilon = 0.9, delta = 1e-6 }}
task = {{ options = {{ max_len = 24, lowercase = true }} }}

[[runs]]
name = "dp"
kind = "central"
data = {{ source = "{NCBI}", options = {{ users = "sentences:10" }}, heldout_fraction = 0.0, max_examples_per_user = 3, eval_source = "tests/data/ncbi-disease/devel.tsv", eval_options = {{ users = "sentences:50" }} }}
task = {{ options = {{ pretrained = "run:public-dp-vocab", max_len = 24 }} }}
privacy = {{ clip_norm = 1.0, noise_multiplier = 1.0, delta = 1e-6 }}
canaries = {{ per_config = 1, user_probabilities = [0.05], example_probabilities = [1.0], patterns = ["HS"] }}
audit = {{ mlm_examples = 2 }}

[[runs]]
name = "ner"
kind = "central"
data = {{ source = "tests/data/wnut17/wnut17train.conll", options = {{ users = "sentences:50" }}, heldout_fraction = 0.0, max_examples_per_user = 5, eval_source = "tests/data/wnut17/emerging.dev.conll", eval_options = {{ users = "sentences:50" }} }}
task = {{ kind = "bert-ner", options = {{ pretrained = "run:dp", max_len = 24 }} }}
"""


@pytest.mark.slow
def test_a_dp_bert_chain_runs_and_reports_the_composed_epsilon(run_toml):
    from fedpriv.report.tables import write_report

    store, summaries = run_toml(CHAIN)
    pub, dp, ner = summaries
    sigma = corollary1_sigma(0.9, 1e-6, 256)
    assert pub["vocabulary"]["dp"]["sigma"] == pytest.approx(sigma) and pub["vocabulary"]["source"] == NCBI
    # the tokenizer carries the settings and the DP guarantee, never the raw-data figures
    from fedpriv.tasks.bert_run import released_vocabulary

    released = released_vocabulary(pub["vocabulary"])
    assert dp["vocabulary"] == ner["vocabulary"] == released and released["dp"]["epsilon"] == pytest.approx(0.9)
    assert json.loads((store / "public-dp-vocab" / "tokenizer.json").read_text())["vocabulary"] == released
    assert {"longest_example_words", "non_private", "examples"} <= set(pub["vocabulary"]) and not {"longest_example_words", "non_private", "examples"} & set(released)
    assert "words_before" in pub["vocabulary"]["dp"] and "words_before" not in released["dp"]
    assert [(store / r / "vocabulary.json").is_file() for r in ("public-dp-vocab", "dp", "ner")] == [True, False, False]
    assert dp["starts_from"] == {"pretrained": "public-dp-vocab"} and ner["starts_from"] == {"pretrained": "dp"}
    assert "add-or-remove-one example" in dp["guarantee"] and dp["audit"]["total"]["canaries"] == 1

    # continued pretraining started from the public run's final parameters, and used its tokenizer
    cfg = json.loads((store / "dp" / "run-config.json").read_text())
    assert cfg["task"]["options"]["pretrained"] == str((store / "public-dp-vocab").resolve())
    pre = load_pretrained(store / "public-dp-vocab", full=True)
    from fedpriv.config import load_config
    from fedpriv.runner.prepare import prepare

    task = prepare(load_config(store / "dp" / "run-config.json")).task
    start = task.init_params(jax.random.key(123))
    assert all(np.array_equal(a, b) for a, b in zip(jax.tree_util.tree_leaves(start), jax.tree_util.tree_leaves(pre.params)))

    stages = chain_stages("ner", {s["name"]: s for s in summaries})
    c = compose(stages[:-1], NCBI)
    assert c["epsilon"] == pytest.approx(0.9 + dp["epsilon"]) and c["delta"] == pytest.approx(2e-6)
    chains = (write_report(store) / "chains.md").read_text()
    assert f"{0.9 + dp['epsilon']:.3g} (δ 2e-06)" in chains and "| ner-" not in chains and "| dp |" in chains
    assert "tagger F1 on wnut17/emerging.dev.conll (%)" in chains and "| public-dp-vocab | ncbi-disease/train.tsv | DP histogram only |" in chains
    assert ner["pieces_per_word"] > 1.0 and "pieces/word on wnut17/wnut17train.conll" in chains
    assert math.isfinite(ner["eval_f1"])


def test_the_chain_table_lists_every_fine_tuning_of_an_encoder_on_the_same_data():
    from fedpriv.report.chain import chains_markdown

    s = _summaries()
    s["ner"]["eval_f1"] = 0.25
    s["ner-frozen"] = {**s["ner"], "name": "ner-frozen", "eval_f1": 0.125}
    row = next(line for line in chains_markdown(s).splitlines() if line.startswith("| dp |"))
    assert row.endswith("| 25.0 (ner); 12.5 (ner-frozen) |")
    del s["ner-frozen"]
    row = next(line for line in chains_markdown(s).splitlines() if line.startswith("| dp |"))
    assert row.endswith("| 25.0 |")  # one fine-tuning: its F1 alone


# ---- what the report says of runs in a chain -----------------------------------------------------------
def test_a_run_carries_the_privacy_of_its_chain():
    from fedpriv.report.chain import ENCODER_UNIT, chain_privacy

    s = _summaries()
    s["dp"]["privacy_unit"] = "example"
    s["ner-ncbi"] = {**s["ner"], "name": "ner-ncbi", "data_source": NCBI}
    # DP continued pretraining: the DP vocabulary and DP-SGD composed on its data
    dp = chain_privacy("dp", s)
    assert (dp["epsilon"], dp["delta"], dp["unit"]) == (1.5, 2e-6, "example") and "basic composition" in dp["assumptions"]
    # a tagger fine-tuned WITHOUT DP on the corpus its encoder was privately pretrained on: the
    # encoder's epsilon, with a unit and a sentence that say its own training is not private
    tagger = chain_privacy("ner-ncbi", s)
    assert (tagger["epsilon"], tagger["delta"], tagger["unit"]) == (1.5, 2e-6, ENCODER_UNIT)
    assert "not private on ncbi-disease/train.tsv" in tagger["assumptions"]
    assert "vocabulary (pub): g" in tagger["assumptions"] and "mlm (dp): dp-sgd" in tagger["assumptions"]  # each stage's relation and sampling
    # fine-tuned on other data: not private on it, and the encoder's guarantee on NCBI is stated
    other = chain_privacy("ner", s)
    assert other["epsilon"] is None and other["unit"] is None
    assert "on ncbi-disease/train.tsv: (1.5, 2e-06)-DP" in other["assumptions"]
    # the run that learned the DP vocabulary: its own training (public text) is not private; the vocabulary's guarantee is stated
    pub = chain_privacy("pub", s)
    assert pub["epsilon"] is None and "on ncbi-disease/train.tsv: (0.5, 1e-06)-DP" in pub["assumptions"]
    # no chain (no earlier run, no DP vocabulary): the run's own columns stand
    s["plain"] = {"name": "plain", "kind": "central", "task": "mlm", "data_source": NCBI, "vocabulary": {"source": NCBI, "dp": None}}
    assert chain_privacy("plain", s) is None and chain_privacy("missing", s) is None
    # a chain whose vocabulary protects another relation: the run's own guarantee, and why the chain does not compose
    s2 = _summaries(vocab=_vocab_record(partition="stream"))
    s2["dp"]["privacy_unit"] = "example"
    own = chain_privacy("dp", s2)
    assert (own["epsilon"], own["unit"]) == (1.0, "example") and "not composed" in own["assumptions"]


def test_the_comparison_rows_of_a_chain_carry_its_privacy():
    from fedpriv.report.chain import ENCODER_UNIT
    from fedpriv.report.tables import comparison_rows, epsilon_text

    s = _summaries()
    s["ner"]["data_source"] = NCBI
    rows = {r["run"]: r for r in comparison_rows([{"name": n, "kind": "central"} for n in s], s)}
    assert rows["ner"]["epsilon"] == 1.5 and rows["ner"]["privacy_unit"] == rows["ner"]["epsilon_unit"] == ENCODER_UNIT  # the CSV unit is the chain's too
    assert epsilon_text(rows["ner"]["epsilon"], rows["ner"]["delta"], rows["ner"]["privacy_unit"]) == "1.5 per example, encoder only (δ = 2e-06)"
    assert rows["dp"]["epsilon"] == 1.5 and rows["pub"]["epsilon"] is None


def _seeded_chain():
    """Two seeds of: public (public vocabulary) and dp (DP vocabulary + DP-SGD), each fine-tuned on NCBI."""
    s = {}
    for seed, (f_pub, f_dp, acc_pub, acc_dp) in enumerate([(0.30, 0.20, 0.17, 0.27), (0.34, 0.22, 0.18, 0.29)]):
        def put(name, **kw):
            s[f"{name}-s{seed}"] = {"name": f"{name}-s{seed}", "group": name, "seed": seed, "kind": "central", **kw}
        put("public", task="mlm", data_source="shakespeare", vocabulary={"source": "shakespeare", "dp": None, "vocab_size": 4000}, eval_accuracy=acc_pub)
        put("dp-vocab", task="mlm", data_source="shakespeare", vocabulary={**_vocab_record(), "vocab_size": 159})
        put("dp", task="mlm", data_source=NCBI, starts_from={"pretrained": f"dp-vocab-s{seed}"}, epsilon=1.0, delta=1e-6, sampling="poisson",
            guarantee="dp-sgd", privacy_unit="example", eval_source="tests/data/ncbi-disease/devel.tsv", eval_accuracy=acc_dp)
        put("ner-public", task="bert-ner", data_source=NCBI, eval_source="tests/data/ncbi-disease/test.tsv", starts_from={"pretrained": f"public-s{seed}"},
            eval_f1=f_pub, pieces_per_word=2.0)
        put("ner-dp", task="bert-ner", data_source=NCBI, eval_source="tests/data/ncbi-disease/test.tsv", starts_from={"pretrained": f"dp-s{seed}"},
            eval_f1=f_dp, pieces_per_word=4.2)
    return s


def test_the_chain_table_groups_seeds_and_keeps_incomparable_mlm_accuracies_apart():
    from fedpriv.report.chain import chains_markdown

    md = chains_markdown(_seeded_chain())
    head = next(line for line in md.splitlines() if line.startswith("| encoder | seeds |"))
    assert "pieces/word on ncbi-disease/train.tsv" in head and "tagger F1 on ncbi-disease/test.tsv (%)" in head and "MLM" not in head
    public = next(line for line in md.splitlines() if line.startswith("| public | 2 |"))
    dp = next(line for line in md.splitlines() if line.startswith("| dp | 2 |"))
    assert "| 2.00 [2.00–2.00] |" in public and public.endswith("| 32.0 [30.0–34.0] |")  # F1 mean and interval over the two seeds
    assert "| 1.5 (δ 2e-06) |" in dp and dp.endswith("| 21.0 [20.0–22.0] |") and "| 4.20 [4.20–4.20] |" in dp
    # MLM accuracy: one block per (evaluation data, vocabulary); never two encoders of different blocks in one table
    blocks = md.split("## Masked-LM accuracy")[1].split("## Each encoder")[0]
    assert "**held-out users of shakespeare**, vocabulary of run public" in blocks
    assert "**ncbi-disease/devel.tsv**, vocabulary of run dp-vocab" in blocks
    first, second = blocks.split("**")[2], blocks.split("**")[4]
    assert "| public | 2 | 17.5 [17.0–18.0] |" in first and "| dp |" not in first
    assert "| dp | 2 | 28.0 [27.0–29.0] |" in second and "| public |" not in second


def test_the_comparison_report_never_puts_two_headline_metrics_in_one_column():
    from fedpriv.report.tables import comparison_markdown, comparison_rows, group_rows

    s = _seeded_chain()
    for name, summary in s.items():
        summary.update({"utility_metric": "f1", "utility_label": "entity F1", "utility": summary.get("eval_f1")} if summary["task"] == "bert-ner"
                       else {"utility_metric": "accuracy", "utility_label": "masked-token accuracy", "utility": summary.get("eval_accuracy")})
    rows = group_rows(comparison_rows([{"name": n, "kind": "central"} for n in s], s), {})
    md = comparison_markdown("x", rows, [], list(s), [], [], [])
    mlm, ner = md.split("### Runs scored by test masked-token accuracy")[1].split("### Runs scored by test entity F1")
    assert "test masked-token accuracy (%)" in mlm and "| ner-" not in mlm and "compare it only between runs" in mlm
    assert "test entity F1 (%)" in ner and "| dp |" not in ner and "| ner-dp | 2 |" in ner and "encoder only" in ner
