"""Which weight versions remain history after the actor restarts."""

from __future__ import annotations

import pytest

from stalwart.rlhf.lineage import Lineage, WeightVersion


def test_versions_after_a_restarts_checkpoint_are_no_longer_history() -> None:
    # a trained 0..12 (checkpoint 8); b resumed at 8 and trained to 14 (checkpoint 12); c resumed at 12.
    lineage = Lineage().extend("a", 0).extend("b", 8).extend("c", 12)
    valid = {
        ("a", 0): True,
        ("a", 8): True,
        ("a", 9): False,
        ("b", 7): False,
        ("b", 8): True,
        ("b", 12): True,
        ("b", 13): False,
        ("c", 12): True,
        ("c", 500): True,
        ("z", 1): False,
    }
    for (incarnation, step), expected in valid.items():
        assert lineage.valid(WeightVersion(incarnation=incarnation, step=step)) is expected, (incarnation, step)


def test_a_rollback_to_an_earlier_step_cuts_every_incarnation() -> None:
    lineage = Lineage().extend("a", 0).extend("b", 8).extend("c", 5)
    assert lineage.valid(WeightVersion(incarnation="a", step=5))
    assert not lineage.valid(WeightVersion(incarnation="a", step=6))
    assert not lineage.valid(WeightVersion(incarnation="b", step=8))


def test_an_incarnation_joins_once() -> None:
    with pytest.raises(ValueError, match="already in the lineage"):
        Lineage().extend("a", 0).extend("a", 3)
