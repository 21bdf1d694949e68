"""The utility target: read on its split only, reached at >= the target, the best value recorded on a miss."""

from __future__ import annotations


def test_a_target_is_read_on_its_split_only():
    from fedpriv.training.loop import Target

    t = Target("validation", "acc", 0.5)
    assert t.reached([{"split": "test", "acc": 0.9}, {"split": "validation", "acc": 0.1}]) is None
    assert t.reached([{"split": "validation", "acc": 0.5}])["acc"] == 0.5


def test_the_target_record_takes_the_first_validation_row_at_or_past_it_else_the_best():
    from fedpriv.runner.summary import target_record

    rows = [{"step": 5, "split": "validation", "acc": 0.3}, {"step": 10, "split": "validation", "acc": 0.2}]
    hit = target_record("acc", 0.3, rows, "central")
    assert (hit["reached"], hit["when"], hit["reached_value"]) == (True, 5, 0.3)  # at the target counts
    miss = target_record("acc", 0.4, rows, "central")
    assert (miss["reached"], miss["reached_value"]) == (False, 0.3)  # the best, not the last
