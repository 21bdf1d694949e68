"""Entity-level NER scoring: conlleval chunk semantics, a conlleval-loop cross-check, device = host."""

import jax
import numpy as np
import pytest

from fedpriv.tasks.ner_metrics import chunk_tables, entity_counts, entity_counts_ids, get_entities, prf, whole_entity_prefix


@pytest.mark.parametrize(
    "seq, chunks",
    [
        (["B-PER", "I-PER", "O", "B-LOC"], [("PER", 0, 1), ("LOC", 3, 3)]),  # seqeval's docstring example
        (["O", "I-PER", "I-PER", "O"], [("PER", 1, 2)]),  # I- after O starts a chunk (IOB1)
        (["I-PER"], [("PER", 0, 0)]),  # I- at the sentence start
        (["B-PER", "I-LOC", "I-LOC"], [("PER", 0, 0), ("LOC", 1, 2)]),  # type change inside a chunk
        (["B-PER", "B-PER", "I-PER"], [("PER", 0, 0), ("PER", 1, 2)]),  # B- after B- splits
        (["I-PER", "B-PER"], [("PER", 0, 0), ("PER", 1, 1)]),
        (["B-PER", "O", "I-PER"], [("PER", 0, 0), ("PER", 2, 2)]),
        (["B-X", "I-X", "E-X", "S-X", "O"], [("X", 0, 2), ("X", 3, 3)]),  # IOBES
        (["E-X", "E-X"], [("X", 0, 0), ("X", 1, 1)]),  # E- after O starts, E- always ends
        (["S-X", "I-X", "E-X"], [("X", 0, 0), ("X", 1, 2)]),  # I- after S- starts
        (["B-X", "S-X"], [("X", 0, 0), ("X", 1, 1)]),  # S- after B- ends and starts
        (["B-X", "E-Y"], [("X", 0, 0), ("Y", 1, 1)]),
        (["B-X", "L-X", "U-Y", "O"], [("X", 0, 1), ("Y", 2, 2)]),  # BILOU reads as IOBES
        (["B-creative-work", "I-creative-work"], [("creative-work", 0, 1)]),  # types with hyphens
        (["O", "O"], []),
        ([], []),
    ],
)
def test_chunks_follow_conlleval(seq, chunks):
    assert get_entities(seq) == chunks


def test_seqeval_readme_example():
    # seqeval's README: f1_score of these is 0.50 (one of two entities right, two predicted).
    y_true = [["O", "O", "O", "B-MISC", "I-MISC", "I-MISC", "O"], ["B-PER", "I-PER", "O"]]
    y_pred = [["O", "O", "B-MISC", "I-MISC", "I-MISC", "I-MISC", "O"], ["B-PER", "I-PER", "O"]]
    tp, n_pred, n_gold = entity_counts(y_true, y_pred)
    assert (tp, n_pred, n_gold) == (1, 2, 2)
    assert prf(tp, n_pred, n_gold) == pytest.approx((0.5, 0.5, 0.5))


def test_iob1_style_prediction_counts_as_correct():
    assert entity_counts([["B-PER", "I-PER", "O"]], [["I-PER", "I-PER", "O"]]) == (1, 1, 1)
    assert entity_counts([["B-PER", "I-PER"]], [["B-PER", "I-LOC"]]) == (0, 2, 1)
    assert entity_counts([["B-PER", "I-PER"]], [["B-LOC", "I-LOC"]]) == (0, 1, 1)
    assert entity_counts([["B-PER", "I-PER", "I-PER"]], [["B-PER", "I-PER", "O"]]) == (0, 1, 1)


def test_prf_zero_denominators():
    assert prf(0, 0, 0) == (0.0, 0.0, 0.0)
    assert prf(0, 3, 0) == (0.0, 0.0, 0.0)
    assert prf(2, 4, 2) == pytest.approx((0.5, 1.0, 2 / 3))


def test_length_mismatch_refused():
    with pytest.raises(ValueError):
        entity_counts([["O", "B-X"]], [["O"]])


# ---- independent reimplementation: conlleval.pl's counting loop, written out separately -------
_END = {("B", "B"), ("B", "S"), ("B", "O"), ("I", "B"), ("I", "S"), ("I", "O")}
_START = {("E", "E"), ("E", "I"), ("S", "E"), ("S", "I"), ("O", "E"), ("O", "I")}


def _parts(tag):
    if tag == "O":
        return "O", ""
    p, t = tag.split("-", 1)
    return {"L": "E", "U": "S"}.get(p, p), t


def _ends(pt, t, pty, ty):
    return pt in ("E", "S") or (pt, t) in _END or (pt != "O" and pty != ty)


def _starts(pt, t, pty, ty):
    return t in ("B", "S") or (pt, t) in _START or (t != "O" and pty != ty)


def conlleval_counts(gold_seqs, pred_seqs):
    """conlleval.pl's token loop (inCorrect flag), sentences separated by an O boundary."""
    correct = found_correct = found_guessed = 0
    for gold, pred in zip(gold_seqs, pred_seqs):
        in_correct = False
        lc, lct, lg, lgt = "O", "", "O", ""
        for ctag, gtag in zip([*gold, "O"], [*pred, "O"]):
            c, ct = _parts(ctag)
            g, gt = _parts(gtag)
            if in_correct:
                ec, eg = _ends(lc, c, lct, ct), _ends(lg, g, lgt, gt)
                if ec and eg and lgt == lct:
                    in_correct = False
                    correct += 1
                elif ec != eg or gt != ct:
                    in_correct = False
            sc, sg = _starts(lc, c, lct, ct), _starts(lg, g, lgt, gt)
            if sc and sg and gt == ct:
                in_correct = True
            found_correct += sc
            found_guessed += sg
            lc, lct, lg, lgt = c, ct, g, gt
    return correct, found_guessed, found_correct


TAGSETS = {
    "bio": ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"],
    "iobes": ["O", "B-PER", "I-PER", "E-PER", "S-PER", "B-LOC", "I-LOC", "E-LOC", "S-LOC"],
}


def _random_pairs(tags, n, seed, max_len=9):
    r = np.random.default_rng(seed)
    p_o = np.full(len(tags), 0.5 / (len(tags) - 1))
    p_o[0] = 0.5
    out = []
    for _ in range(n):
        length = int(r.integers(0, max_len + 1))
        gold = r.choice(len(tags), length, p=p_o)
        pred = np.where(r.random(length) < 0.6, gold, r.choice(len(tags), length, p=p_o))
        out.append(([tags[i] for i in gold], [tags[i] for i in pred]))
    return out


@pytest.mark.parametrize("scheme", ["bio", "iobes"])
def test_entity_counts_match_conlleval_loop(scheme):
    pairs = _random_pairs(TAGSETS[scheme], 2000, seed=1)
    golds, preds = [g for g, _ in pairs], [p for _, p in pairs]
    counts = entity_counts(golds, preds)
    assert counts == conlleval_counts(golds, preds)
    assert counts[0] > 100  # the random pairs do exercise matches


@pytest.mark.parametrize("scheme", ["bio", "iobes"])
def test_device_counts_equal_host_counts(scheme):
    tags = TAGSETS[scheme]
    tables = chunk_tables(tags)
    L = 9
    pairs = _random_pairs(tags, 400, seed=2, max_len=L)
    r = np.random.default_rng(3)
    gold = r.integers(0, len(tags), (len(pairs), L)).astype(np.int32)  # junk past each length
    pred = r.integers(0, len(tags), (len(pairs), L)).astype(np.int32)
    length = np.zeros(len(pairs), np.int32)
    for b, (g, p) in enumerate(pairs):
        length[b] = len(g)
        gold[b, : len(g)] = [tags.index(t) for t in g]
        pred[b, : len(p)] = [tags.index(t) for t in p]
    tp, n_pred, n_gold = jax.jit(lambda g, p, n: entity_counts_ids(g, p, n, tables))(gold, pred, length)
    for b, (g, p) in enumerate(pairs):
        assert (int(tp[b]), int(n_pred[b]), int(n_gold[b])) == entity_counts([g], [p]), (g, p)


def test_chunk_tables_need_o():
    with pytest.raises(ValueError):
        chunk_tables(["B-X", "I-X"])


@pytest.mark.parametrize(
    "tags, fit, expected",
    [
        (["B-D", "I-D", "O", "B-D"], 4, (4, 0)),  # everything fits
        (["B-D", "I-D", "O", "B-D"], 9, (4, 0)),  # more room than words
        (["B-D", "I-D", "O", "B-D"], 3, (3, 1)),  # the cut falls between entities: the last one is missed
        (["O", "B-D", "I-D", "I-D", "O"], 3, (1, 1)),  # the cut would split an entity: moved to its start
        (["O", "I-D", "I-D", "B-D"], 2, (1, 2)),  # an I- after O starts an entity (IOB1)
        (["B-X", "E-X", "S-Y"], 1, (0, 2)),  # IOBES
        (["O", "O"], 1, (1, 0)),
        (["B-D"], 0, (0, 1)),
        ([], 5, (0, 0)),
    ],
)
def test_whole_entity_prefix(tags, fit, expected):
    kept, cut = whole_entity_prefix(tags, fit)
    assert (kept, cut) == expected
    # every gold entity is either kept whole or counted as cut, never shortened
    assert get_entities(tags[:kept]) == [c for c in get_entities(tags) if c[2] < kept]
    assert len(get_entities(tags[:kept])) + cut == len(get_entities(tags))
