"""The BERT pretrain -> fine-tune chain: task kinds mlm and bert-ner, the tokenizer saved in the run
directory, pretrained encoders loaded into the NER task, and the errors for runs that do not fit."""

from __future__ import annotations

import json
from itertools import islice
from pathlib import Path

import jax
import numpy as np
import pytest
from flax import serialization

from fedpriv.config import validate_config
from fedpriv.data.conll import iter_sentences
from fedpriv.data.corpus import FederatedCorpus
from fedpriv.data.examples import TaggedExample, TextExample
from fedpriv.errors import ConfigError, FedprivError
from fedpriv.rundir import TOKENIZER as TOKENIZER_FILE
from fedpriv.tasks.bert_ner import BertNERTask
from fedpriv.tasks.bert_run import load_pretrained, load_tokenizer, save_tokenizer
from fedpriv.tasks.mlm import MLMTask
from fedpriv.tasks.registry import build_task
from fedpriv.vocab.wordpiece import WordPieceVocab, learn_wordpiece

NCBI = Path(__file__).resolve().parents[1] / "data" / "ncbi-disease"


def ncbi(n: int, split: str = "train") -> list[TaggedExample]:
    return [s for _, s in islice(iter_sentences(NCBI / f"{split}.tsv"), n)]


def tagged_corpus(sentences, per_user: int = 10) -> FederatedCorpus:
    return FederatedCorpus.from_dict({f"u{i:03d}": sentences[i : i + per_user] for i in range(0, len(sentences), per_user)}, "ncbi-part")


def config(kind: str, model: str = "tiny", size: int = 300, **options) -> object:
    return validate_config({"name": "t", "vocab": {"size": size}, "task": {"kind": kind, "model": model, "options": options}})


def write_conll(path: Path, sentences) -> Path:
    path.write_text("".join("".join(f"{w}\t{t}\n" for w, t in zip(s.tokens, s.tags)) + "\n" for s in sentences))
    return path


def fake_run(run_dir: Path, task: MLMTask, seed: int = 5) -> dict:
    """A finished MLM run directory as the trainer leaves it: tokenizer.json, params.msgpack."""
    params = task.init_params(jax.random.key(seed))
    save_tokenizer(task, run_dir)
    (run_dir / "params.msgpack").write_bytes(serialization.to_bytes(params))
    return params


# ---- the registry ---------------------------------------------------------------------------------
def test_registry_builds_mlm_and_bert_ner():
    train = tagged_corpus(ncbi(120))
    mlm = build_task(config("mlm", max_len=32, lowercase=True), train)
    assert isinstance(mlm, MLMTask) and mlm.max_len == 32 and mlm.vocab.lowercase
    assert mlm.cfg.hidden == 64 and 100 < len(mlm.vocab) <= 300  # the tiny preset, vocab.size tokens at most
    # MLM on a tagged corpus encodes the tokens as text: the same rows as the joined text
    text = FederatedCorpus.from_dict({u: [TextExample(" ".join(e.tokens)) for e in exs] for u, exs in train.users()}, "text")
    mlm_text = build_task(config("mlm", max_len=32, lowercase=True), text)
    assert mlm_text.vocab.tokens == mlm.vocab.tokens
    exs = list(islice(train.records(), 8))
    np.testing.assert_array_equal(mlm.encode(exs)["ids"], mlm_text.encode([TextExample(" ".join(e.tokens)) for e in exs])["ids"])

    ner = build_task(config("bert-ner", max_len=40), train)
    assert isinstance(ner, BertNERTask) and ner.tags == ("O", "B-Disease", "I-Disease") and ner.pretrained is None
    with pytest.raises(ConfigError, match="needs tagged examples"):
        build_task(config("bert-ner"), text)
    with pytest.raises(ConfigError, match="task.model: unknown mlm preset 'huge'; choose one of tiny, small"):
        build_task(config("mlm", model="huge"), train)
    with pytest.raises(ConfigError, match="unknown key.*mask_rate"):
        build_task(config("mlm", mask_rate=0.2), train)


def test_tokenizer_is_learned_from_the_training_users_only(tmp_path):
    sents = ncbi(60)
    odd = TaggedExample(tuple(["qqxqqz"] * 12), tuple(["O"] * 12))
    train = write_conll(tmp_path / "train.tsv", sents)
    evals = write_conll(tmp_path / "eval.tsv", [odd] * 30 + sents[:5])
    from fedpriv.runner.prepare import prepare

    raw = {"name": "t", "data": {"source": str(train), "eval_source": str(evals)}, "vocab": {"size": 400}, "task": {"kind": "mlm", "model": "tiny", "options": {"max_len": 24}}}
    task = prepare(validate_config(raw)).task
    assert not any("qq" in t for t in task.vocab.tokens)
    # the control: the same word in the training file does become a token
    write_conll(train, sents + [odd] * 30)
    task = prepare(validate_config(raw)).task
    assert "qqxqqz" in task.vocab.tokens


# ---- the tokenizer file ---------------------------------------------------------------------------
def test_tokenizer_saved_and_reloaded_identically(tmp_path):
    sents = ncbi(200)
    counts: dict[str, int] = {}
    for s in sents:
        for w in s.tokens:
            counts[w.lower()] = counts.get(w.lower(), 0) + 1
    tok = learn_wordpiece(counts, 500)
    task = MLMTask(tok, max_len=48, model="tiny", lowercase=True)
    save_tokenizer(task, tmp_path)
    back = load_tokenizer(tmp_path)
    assert back.wordpiece.tokens == tok.tokens and back.lowercase is True
    assert back.preset == "tiny" and back.shape["hidden"] == 64 and back.task == "mlm"
    words = [w for s in ncbi(100, "test") for w in s.tokens]  # unseen text: [UNK]s and long splits too
    assert [back.wordpiece.tokenize_word(w.lower()) for w in words] == [tok.tokenize_word(w.lower()) for w in words]
    again = MLMTask(back.wordpiece, max_len=48, model="tiny", lowercase=back.lowercase)
    exs = [TextExample(" ".join(s.tokens)) for s in ncbi(50, "test")]
    np.testing.assert_array_equal(again.encode(exs)["ids"], task.encode(exs)["ids"])
    assert not (task.encode(exs)["ids"] == task.vocab.unk).all()
    # the JSON record keeps non-default tokenizer settings too
    odd = WordPieceVocab(["<u>", "<p>", "ab", "##c", "a", "##b"], reserved_tokens=["<u>", "<p>"], unk_token="<u>", max_input_chars_per_word=3)
    same = WordPieceVocab.from_json(json.loads(json.dumps(odd.to_json())))
    for w in ["abc", "abcd", "ac", "a"]:
        assert same.tokenize_word(w) == odd.tokenize_word(w)
    assert odd.tokenize_word("abcd") == ("<u>",)  # longer than 3 characters
    with pytest.raises(FedprivError, match="not a WordPiece tokenizer"):
        WordPieceVocab.from_json({"tokens": ["a"]})
    (tmp_path / TOKENIZER_FILE).write_text("{not json")
    with pytest.raises(FedprivError, match="tokenizer.json"):
        load_tokenizer(tmp_path)


# ---- fine-tuning from a pretrained run ------------------------------------------------------------
@pytest.fixture(scope="module")
def pretrained_run(tmp_path_factory):
    train = tagged_corpus(ncbi(120))
    mlm = build_task(config("mlm", max_len=32, lowercase=True), train)
    run = tmp_path_factory.mktemp("mlm-run")
    params = fake_run(run, mlm)
    return train, mlm, run, params


def test_fine_tune_init_carries_the_pretrained_encoder(pretrained_run):
    from fedpriv.training.loop import init_key

    train, mlm, run, mlm_params = pretrained_run
    ner = build_task(config("bert-ner", size=50, max_len=40, pretrained=str(run)), train)  # vocab.size is not used
    assert ner.vocab.tokens == mlm.vocab.tokens and ner.vocab.lowercase  # the pretrained run's tokenizer and setting
    assert Path(ner.pretrained_from) == run
    key = init_key(0)  # what the central trainer passes
    params = ner.init_params(key)
    enc, src = jax.tree_util.tree_leaves_with_path(params["encoder"]), jax.tree_util.tree_leaves_with_path(mlm_params["encoder"])
    assert [p for p, _ in enc] == [p for p, _ in src] and len(enc) > 10
    for (path, a), (_, b) in zip(enc, src):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=jax.tree_util.keystr(path))
    # the head is fresh: what a scratch task initializes with the same key, not anything of the MLM run
    scratch = BertNERTask(mlm.vocab.tokenizer, ner.tags, max_len=40, model="tiny", lowercase=True)
    fresh = scratch.init_params(key)
    assert set(params) == {"encoder", "classifier"}
    np.testing.assert_array_equal(params["classifier"]["kernel"], fresh["classifier"]["kernel"])
    # ... and the encoder is not: a scratch init differs from the pretrained weights
    assert not np.array_equal(fresh["encoder"]["token_embed"]["embedding"], params["encoder"]["token_embed"]["embedding"])


def test_pretrained_runs_that_do_not_fit_are_refused(pretrained_run, tmp_path, monkeypatch):
    train, mlm, run, _ = pretrained_run
    with pytest.raises(ConfigError, match=r"holds BERT 'tiny' \(hidden 64.*task.model = 'small'.*set task.model = 'tiny'"):
        build_task(config("bert-ner", model="small", pretrained=str(run)), train)
    with pytest.raises(ConfigError, match="lowercase = False but the pretrained tokenizer .* lowercase = True"):
        build_task(config("bert-ner", pretrained=str(run), lowercase=False), train)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match="no run directory at runs/nope .*resolved to .*runs/nope"):
        build_task(config("bert-ner", pretrained="runs/nope"), train)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="no tokenizer.json.*task.kind = 'mlm'"):
        build_task(config("bert-ner", pretrained="empty"), train)
    # a run that has not finished (a checkpoint, no final parameters), or never checkpointed
    half = tmp_path / "half"
    half.mkdir()
    save_tokenizer(mlm, half)
    with pytest.raises(ConfigError, match="has no checkpoint"):
        build_task(config("bert-ner", pretrained="half"), train)
    (half / "checkpoint.json").write_text(json.dumps({"step": 7, "state_file": "checkpoint-7.msgpack"}))
    with pytest.raises(ConfigError, match="checkpoint at step 7 but did not finish"):
        build_task(config("bert-ner", pretrained="half"), train)
    # a tokenizer that is not the model's vocabulary (e.g. copied from another run)
    other = tmp_path / "other"
    other.mkdir()
    fake_run(other, mlm)
    small_vocab = MLMTask(learn_wordpiece({"abc": 5, "abd": 4}, 20), max_len=32, model="tiny")
    save_tokenizer(small_vocab, other)
    with pytest.raises(FedprivError, match=r"holds \d+ tokens but the encoder .* embeds \d+: the tokenizer is not the vocabulary"):
        build_task(config("bert-ner", pretrained="other"), train)
    with pytest.raises(FedprivError, match="holds no BERT encoder"):
        (other / "params.msgpack").write_bytes(serialization.to_bytes({"lstm": np.zeros(3)}))
        load_pretrained(other)


def test_shipped_control_uses_the_pretrained_chain_s_vocabulary():
    """The scratch control learns exactly the vocabulary the MLM run saves (same users, size, casing)."""
    from fedpriv.config import load_config
    from fedpriv.runner.prepare import load_training_corpora

    tokens = []
    for name in ["ncbi-mlm-bert-tiny", "ncbi-ner-bert-tiny-scratch"]:
        cfg = load_config(f"experiments/{name}.toml")
        train, _ = load_training_corpora(cfg, lambda _m: None)
        tokens.append(build_task(cfg, train).vocab.tokens)
    assert tokens[0] == tokens[1] and len(tokens[0]) > 1000
    mlm = load_config("experiments/ncbi-mlm-bert-tiny.toml")
    pre, ner = load_config("experiments/ncbi-ner-bert-tiny.toml"), load_config("experiments/ncbi-ner-bert-tiny-scratch.toml")
    assert pre.training == ner.training and pre.task.model == ner.task.model == mlm.task.model
    assert pre.data == ner.data and pre.data.source == mlm.data.source and pre.seed == ner.seed
    assert pre.task.options["pretrained"] == "runs/ncbi-mlm-bert-tiny" and "pretrained" not in ner.task.options
    assert ner.task.options["lowercase"] is mlm.task.options["lowercase"] is True
    assert pre.task.options["max_len"] == ner.task.options["max_len"]


# ---- end to end through the CLI -------------------------------------------------------------------
def test_cli_pretrain_then_fine_tune(tmp_path, monkeypatch, capsys):
    from fedpriv.cli import main

    write_conll(tmp_path / "train.tsv", ncbi(160))
    write_conll(tmp_path / "test.tsv", ncbi(40, "test"))
    monkeypatch.chdir(tmp_path)  # relative paths, the pretrained run's too, are resolved here

    def toml(name, kind, options, steps):
        return (
            f'name = "{name}"\n[data]\nsource = "train.tsv"\neval_source = "test.tsv"\n[vocab]\nsize = 400\n'
            f'[task]\nkind = "{kind}"\nmodel = "tiny"\noptions = {options}\n'
            f"[training]\nlearning_rate = 0.002\nbatch_size = 16\nsteps = {steps}\neval_every = 10\ncheckpoint_every = {steps}\n"
        )

    Path("mlm.toml").write_text(toml("mlm", "mlm", "{ max_len = 32, lowercase = true }", 100))
    Path("ner.toml").write_text(toml("ner", "bert-ner", '{ max_len = 40, pretrained = "runs/mlm" }', 10))
    assert main(["train", "central", "mlm.toml", "--json"]) == 0
    mlm = json.loads(capsys.readouterr().out)
    rows = [json.loads(line) for line in Path("runs/mlm/metrics.jsonl").read_text().splitlines()]
    train_loss = [r["loss"] for r in rows if r["split"] == "train"]
    assert train_loss[-1] < train_loss[0] - 0.3, train_loss  # MLM loss falls
    assert mlm["final_loss"] < np.log(mlm["vocab_size_with_specials"]) - 0.4  # below a uniform guess
    assert (Path("runs/mlm") / TOKENIZER_FILE).is_file() and Path("runs/mlm/params.msgpack").is_file()

    assert main(["train", "central", "ner.toml", "--json"]) == 0
    ner = json.loads(capsys.readouterr().out)
    assert Path(ner["pretrained_from"]).resolve() == (tmp_path / "runs" / "mlm").resolve()
    assert ner["vocab_size_with_specials"] == mlm["vocab_size_with_specials"]
    assert 0.0 <= ner["final_f1"] <= 1.0
    # the fine-tuning run saves the same tokenizer, so a later stage can chain from it as well
    assert json.loads(Path("runs/ner/tokenizer.json").read_text())["wordpiece"] == json.loads(Path("runs/mlm/tokenizer.json").read_text())["wordpiece"]
    # a fine-tuning config that asks for another shape is refused with one clear line
    Path("bad.toml").write_text(toml("bad", "bert-ner", '{ pretrained = "runs/mlm" }', 10).replace('model = "tiny"', 'model = "small"'))
    assert main(["train", "central", "bad.toml"]) == 2
    assert "set task.model = 'tiny'" in capsys.readouterr().err
