"""``[[measure]]`` in experiment files: plausible deniability and token inversion (Qu et al. 2021,
sec. 5.3-5.4) computed by ``fedpriv run`` into the run store and shown in the report, on the
embedding space of an NWP run (words) and of a BERT run (WordPiece pieces)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from fedpriv.errors import ConfigError, FedprivError
from fedpriv.runner.grid import read_experiment
from fedpriv.runner.store import run_experiment

HUGE, TINY = 1e6, 1e-3  # eta: no noise to speak of / noise radius dim/eta far beyond the table
TRIALS = 20

EXPERIMENT = f"""
name = "measure-test"
seed = 3

[data]
source = "shakespeare"
min_examples = 3
max_examples_per_user = 3

[vocab]
size = 150
seq_len = 10

[task]
kind = "nwp"
model = "tiny"

[training]
batch_size = 16
steps = 2
eval_every = 2
checkpoint_every = 2
eval_batch_size = 64

[[runs]]
name = "nwp"
kind = "central"

[[runs]]
name = "mlm"
kind = "central"
vocab = {{ size = 200 }}
task = {{ kind = "mlm", model = "tiny", options = {{ max_len = 16, lowercase = true }} }}

[[measure]]
name = "nwp-words"
embeddings = "run:nwp"
etas = [{TINY}, {HUGE}]
trials = {TRIALS}
sample = 30
inversion_tokens = 500

[[measure]]
name = "bert-pieces"
embeddings = "run:mlm"
etas = [{TINY}, 5, {HUGE}]
trials = {TRIALS}
sample = "all"
inversion_source = "tests/data/ncbi-disease/train.tsv"
inversion_options = {{ users = "sentences:50" }}
inversion_tokens = 500
"""

HEAD = EXPERIMENT.split("[[measure]]")[0]


def _write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "exp.toml"
    p.write_text(text)
    return p


def _toml(v) -> str:
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{k} = {_toml(x)}" for k, x in v.items()) + " }"
    return json.dumps(v)


def _measure(**kv) -> str:
    body = {"name": "m", "embeddings": "run:nwp", "etas": [4], **kv}
    return "\n[[measure]]\n" + "\n".join(f"{k} = {_toml(v)}" for k, v in body.items()) + "\n"


# ---- parsing and validation ---------------------------------------------------------------------------
def test_measures_are_parsed_with_their_defaults(tmp_path):
    e = read_experiment(_write(tmp_path, HEAD + _measure(etas=[4, 8.5]) + _measure(name="glove", embeddings="vectors.txt", etas=[1], seed=9, sample="all")))
    assert [r.name for r in e.runs] == ["nwp", "mlm"]
    m, g = e.measures
    assert m.etas == [4.0, 8.5] and m.trials == 1000 and m.sample == 300 and m.mechanism == "txt" and m.t is None
    assert m.seed == 3 and g.seed == 9  # the experiment's seed unless given
    assert m.inversion_source == "shakespeare" and m.inversion_options == {} and m.inversion_tokens == 20_000  # the experiment's [data]
    assert g.embeddings == "vectors.txt" and g.sample == "all"


REFUSED = [
    (_measure(etaz=[4]), "[[measure]] 'm': unknown key 'etaz' (a [[measure]] takes name, embeddings, etas"),
    (_measure(etas=[4, 0]), "[[measure]] 'm': etas: eta must be finite and > 0"),
    (_measure(etas=[-1]), "etas: eta must be finite and > 0"),
    (_measure(etas=[]), "etas: List should have at least 1 item"),
    (_measure(etas=[4, 4]), "etas must be distinct"),
    (_measure(trials=0), "[[measure]] 'm': trials: Input should be greater than or equal to 1"),
    (_measure(sample=0), "sample must be >= 1 or 'all'"),
    (_measure(inversion_tokens=-5), "inversion_tokens must be >= 0"),
    (_measure(mechanism="rep"), "mechanism: Input should be 'txt' or 'vickrey'"),
    (_measure(mechanism="vickrey"), "mechanism 'vickrey' needs t in [0, 1]"),
    (_measure(mechanism="vickrey", t=1.5), "must be in [0, 1], got 1.5"),
    (_measure(t=0.5), "t is the Vickrey tuning parameter"),
    (_measure(embeddings="run:nope"), "embeddings = 'run:nope' names no run of this experiment (runs: nwp, mlm)"),
    (_measure(name="a/b"), "name 'a/b' must be letters, digits and _.=+- (it names a directory)"),
    (_measure(inversion_options={"users": "sentences:5"}), "inversion_options and inversion_format apply to inversion_source"),
    (_measure() + _measure(etas=[8]), "two [[measure]] entries are named 'm'"),
    ('\n[measure]\nname = "m"\n', "write [[measure]], not [measure]"),
    ("\n[[measure]]\netas = [4]\nembeddings = \"x\"\n", "measure[0]: name: Field required"),
]


@pytest.mark.parametrize("entry, message", REFUSED, ids=[m.split(": ")[-1][:36] for _, m in REFUSED])
def test_impossible_measures_are_refused_at_load_time_naming_the_file(tmp_path, entry, message):
    path = _write(tmp_path, HEAD + entry)
    with pytest.raises(ConfigError) as err:
        read_experiment(path)
    assert str(err.value).startswith(f"{path}: ") and message in str(err.value), str(err.value)
    with pytest.raises(ConfigError, match="measure"):  # before any training: not even the store is made
        run_experiment(path, tmp_path / "store")
    assert not (tmp_path / "store").exists()


# ---- end to end --------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    root = tmp_path_factory.mktemp("measure")
    exp = _write(root, EXPERIMENT)
    lines: list[str] = []
    store, summaries, complete = run_experiment(exp, root / "store", log=lines.append)
    assert complete and [s["name"] for s in summaries] == ["nwp", "mlm"]
    return exp, store, lines


def _record(store: Path, name: str) -> dict:
    return json.loads((store / "measure" / name / "measure.json").read_text())


def _check_measurement(rec: dict, etas: list[float], tokens: int) -> None:
    d, inv = rec["deniability"], rec["inversion"]
    assert d["trials"] == TRIALS and d["mechanism"] == "txt" and d["tokens"] == tokens
    assert [s["eta"] for s in d["summary"]] == etas
    for s in d["summary"]:
        assert 0 <= s["N_w"]["min"] <= s["N_w"]["max"] <= TRIALS
        assert 1 <= s["S_w"]["min"] <= s["S_w"]["max"] <= TRIALS
    huge, tiny = d["summary"][-1], d["summary"][0]
    assert huge["N_w"]["min"] == TRIALS and huge["S_w"]["max"] == 1  # no noise to speak of: every output is the input
    assert tiny["N_w"]["p50"] <= 1 and tiny["S_w"]["p50"] >= TRIALS / 2
    assert inv["mechanism"] == "rep" and inv["tokens"] == 500
    assert inv["accuracy"][f"{HUGE:g}"] == 1.0
    assert inv["accuracy"][f"{TINY:g}"] < 0.1  # near chance: the noise swamps the table
    assert set(rec["guarantee"]) == {f"{e:g}" for e in etas} and all("eta·d_chi" in g for g in rec["guarantee"].values())
    assert "Euclidean distance between embeddings" in rec["guarantee"][f"{etas[0]:g}"]


def test_an_nwp_run_measured_in_words(measured):
    _, store, lines = measured
    rec = _record(store, "nwp-words")
    assert rec["config"]["embeddings"] == "run:nwp" and rec["config"]["seed"] == 3
    assert rec["embeddings_path"] == str((store / "nwp").resolve())
    assert rec["unit"] == "word" and rec["embeddings"]["kind"] == "fedpriv-nwp-run" and rec["embeddings"]["allowed_outputs"] == 150
    _check_measurement(rec, [TINY, HUGE], 30)
    assert rec["inversion"]["source"] == "shakespeare" and rec["inversion"]["skipped_out_of_vocabulary"] > 0  # a 150-word vocabulary
    assert (store / "measure" / "nwp-words" / "deniability.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert any(m.startswith("[measure nwp-words] eta 0.001: median N_w") for m in lines)
    assert any(m.startswith("[measure nwp-words] eta 1e+06: inversion accuracy 1.0000") for m in lines)


def test_a_bert_run_measured_in_wordpiece_pieces(measured):
    from fedpriv.runner.embeddings import load_embeddings, load_run_embeddings
    from fedpriv.tasks.bert_run import load_pretrained
    from fedpriv.tasks.mlm import PieceVocab

    _, store, _ = measured
    rec = _record(store, "bert-pieces")
    space = load_run_embeddings(store / "mlm")
    pre = load_pretrained(store / "mlm")
    assert space.unit == "piece" and space.words == pre.tokenizer.wordpiece.tokens
    assert np.array_equal(space.table, np.asarray(pre.encoder["token_embed"]["embedding"]))
    specials = {"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"}
    assert {space.words[i] for i in space.allowed} == set(space.words) - specials and space.words[space.oov_id] == "[UNK]"
    # corpus words become the run's pieces, lowercased as its tokenizer says
    vocab = PieceVocab(pre.tokenizer.wordpiece, pre.tokenizer.lowercase)
    words = ["The", "KING", "zounds", "thee"]
    assert list(space.corpus_ids(words)) == [i for w in words for i in vocab.word_ids(w.lower())]
    assert list(space.corpus_ids(["the"])) == list(space.corpus_ids(["THE"]))
    assert rec["unit"] == "piece" and rec["embeddings"]["kind"] == "fedpriv-bert-run" and rec["embeddings"]["lowercase"] is True
    _check_measurement(rec, [TINY, 5.0, HUGE], int(space.allowed.size))  # sample = "all"
    assert rec["inversion"]["unit"] == "piece" and rec["inversion"]["source"].endswith("train.tsv")
    with pytest.raises(FedprivError, match="WordPiece pieces, not words; privatizing text needs word embeddings"):
        load_embeddings(store / "mlm")  # text privatization refuses a subword space


def test_a_rerun_skips_measurements_and_a_changed_one_is_refused(measured, tmp_path):
    exp, store, _ = measured
    before = (store / "measure" / "bert-pieces" / "measure.json").read_bytes()
    lines: list[str] = []
    _, _, complete = run_experiment(exp, store, log=lines.append)
    assert complete and "[measure nwp-words] complete, skipped" in lines and "[measure bert-pieces] complete, skipped" in lines
    assert (store / "measure" / "bert-pieces" / "measure.json").read_bytes() == before
    changed = tmp_path / "changed.toml"
    changed.write_text(EXPERIMENT.replace("sample = 30", "sample = 31"))
    with pytest.raises(FedprivError, match="measure/nwp-words: the \\[\\[measure\\]\\] 'nwp-words' config changed"):
        run_experiment(changed, store)


def test_the_report_shows_the_measurements(measured):
    from fedpriv.report.tables import write_report

    _, store, _ = measured
    out = write_report(store)
    md = (out / "measurements.md").read_text()
    assert md.startswith("# Local privacy measurements")
    assert md.index("## nwp-words") < md.index("## bert-pieces")  # the file's order
    assert "| eta | median N_w (p5–p95) | median S_w (p5–p95) | inversion accuracy |" in md
    assert f"| 1e+06 | {TRIALS} ({TRIALS}–{TRIALS}) | 1 (1–1) | 100.0% |" in md
    assert "**Guarantee** (per token):" in md and "eta·d_chi" in md and "WordPiece pieces of a mlm run" in md
    assert "![N_w and S_w of bert-pieces](deniability-bert-pieces.png)" in md
    assert (out / "deniability-nwp-words.png").is_file() and (out / "deniability-bert-pieces.png").is_file()
    assert "[measurements.md](measurements.md)" in (out / "comparison.md").read_text()
