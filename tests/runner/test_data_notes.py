"""Every choice the data preparation makes on its own is said once in the log and recorded in the
run (``data.json``, and the run's summary): synthetic users, dropped accounts, examples cut."""

import json

from fedpriv.config import validate_config
from fedpriv.rundir import DATA, RunDir
from fedpriv.runner.prepare import prepare
from fedpriv.runner.summary import run_summary


def test_stackexchange_notes_and_truncation_reach_the_log_and_the_run(tmp_path, coffee_posts):
    cfg = validate_config({"name": "se", "data": {"source": str(coffee_posts)}, "vocab": {"size": 300, "seq_len": 15}})
    said: list[str] = []
    p = prepare(cfg, said.append)
    notes = [m.removeprefix("note: ") for m in said if m.startswith("note: ")]
    assert notes[0] == "12 posts of account -1 (the Community account) dropped (drop_owners=['-1']; pass drop_owners=[] to keep them)"
    train = [len(e.words()) - 15 for e in p.train.records() if len(e.words()) > 15]
    held = [len(e.words()) - 15 for e in p.eval["heldout"].records() if len(e.words()) > 15]
    assert notes[1:] == [
        f"vocab.seq_len = 15 words: {len(train):,} of {p.train.num_examples:,} training examples ({len(train) / p.train.num_examples:.1%}) are longer and were cut ({sum(train):,} words dropped)",
        f"vocab.seq_len = 15 words: {len(held):,} of {p.eval['heldout'].num_examples:,} heldout examples ({len(held) / p.eval['heldout'].num_examples:.1%}) are longer and were cut ({sum(held):,} words dropped)",
    ]
    assert len(set(notes)) == len(notes) == 3  # each said once
    run = RunDir(tmp_path / "run").create()
    p.save_assets(run.path)
    data = json.loads(run.file(DATA).read_text())
    words_in = sum(len(e.words()) for e in p.train.records())
    assert data["notes"] == notes and data["cut"]["training"] == {
        "examples": p.train.num_examples, "cut": len(train), "words": sum(train), "words_in": words_in, "pieces_in": None}
    assert data["source"]["skipped_dropped_owner"] == 12
    assert run_summary("se", "central", cfg, run.path)["data_notes"] == notes


def test_synthetic_conll_users_and_ner_truncation(tmp_path):
    p = tmp_path / "tweets.conll"
    p.write_text("\n\n".join(f"@user{i}\tO\nlikes\tO\nParis\tB-LOC\nand\tO\nRome\tB-LOC\nso\tO\nmuch\tO" if i % 2 else "hi\tO\nBonn\tB-LOC" for i in range(40)) + "\n")
    ev = tmp_path / "dev.conll"
    ev.write_text("# newdoc id = d1\nok\tO\n\n# newdoc id = d2\nBerlin\tB-LOC\n")
    cfg = validate_config({"name": "ner", "data": {"source": str(p), "eval_source": str(ev)}, "task": {"kind": "ner", "options": {"max_len": 5}}})
    said: list[str] = []
    prep = prepare(cfg, said.append)
    notes = [m for m in said if m.startswith("note: ")]
    assert notes == [
        "note: tweets.conll marks no documents (-DOCSTART-, '# newdoc id = ...'), so users='auto' made blocks of sentences",
        "note: users are synthetic: 4 blocks of 10 consecutive sentences (users='sentences:10')",
        "note: data.eval_source: users are the file's 2 documents (users='auto'; named by their ids)",
        "note: task.options.max_len = 5 tokens: 20 of 40 training examples (50.0%) are longer and were cut (40 words dropped)",
    ]
    assert prep.train.num_users == 4 and prep.data["notes"] == [n.removeprefix("note: ") for n in notes]
    assert prep.summary()["notes"] == prep.data["notes"]


def test_arxiv_sentences_are_said_once_and_recorded(tmp_path):
    """The arXiv slice read as sentences: the splitter's note once in the log and in data.json,
    with the rows and sentences it counted; the cut counts from the flat path match the records."""
    from pathlib import Path

    arxiv = Path(__file__).resolve().parents[1] / "data" / "arxiv-csai" / "abstracts.jsonl.gz"
    options = {"user_column": "first_author", "text_column": "abstract", "unit": "sentence"}
    cfg = validate_config({"name": "arxiv", "data": {"source": str(arxiv), "options": options}, "vocab": {"size": 2000, "seq_len": 20}})
    said: list[str] = []
    p = prepare(cfg, said.append)
    notes = [m.removeprefix("note: ") for m in said if m.startswith("note: ")]
    assert notes[0].startswith("examples are sentences (unit='sentence'): 3,295 rows of abstracts.jsonl.gz split into ")
    assert sum(n.startswith("examples are sentences") for n in notes) == 1
    assert p.data["notes"] == notes and p.data["source"]["unit"] == "sentence" and p.data["source"]["split_rows"] == 3295
    assert p.data["source"]["sentences"] == p.train.num_examples + p.eval["heldout"].num_examples
    cut = [len(e.words()) - 20 for e in p.train.records() if len(e.words()) > 20]
    assert p.data["cut"]["training"]["cut"] == len(cut) and p.data["cut"]["training"]["words"] == sum(cut)
