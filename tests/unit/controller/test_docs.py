"""docs/control-plane.md and the transition table's docstring show the state machine and the detectors
as the code has them."""

from __future__ import annotations

from support.paths import REPO

from stalwart.controller.core import transitions
from stalwart.controller.core.detectors import DETECTORS
from stalwart.controller.core.transitions import ACTIVE, TABLE, WAITING_FOR_NODES, Trigger
from stalwart.store.records import JobStage

DOC = REPO / "docs" / "control-plane.md"


def render_table() -> str:
    """The transition table as the docs show it (the rows a trigger takes from many stages folded into one)."""
    lines = ["| from | trigger | to | when |", "|---|---|---|---|"]
    fold = {Trigger.SUSPEND: ACTIVE, Trigger.NODES_KEEP_DYING: WAITING_FOR_NODES}
    folded: set[Trigger] = set()
    for row in TABLE:
        source = row.source.value if row.source else "(none)"
        if row.trigger in fold:
            if row.trigger in folded:
                continue
            folded.add(row.trigger)
            source = "any of " + ", ".join(s.value for s in fold[row.trigger])
        lines.append(f"| {source} | {row.trigger.value} | {row.target.value} | {row.when} |")
    return "\n".join(lines)


def test_the_docs_show_the_transition_table_as_it_is() -> None:
    assert render_table() in DOC.read_text(), "update docs/control-plane.md's table to:\n" + render_table()


def test_the_diagram_names_every_stage_and_trigger_and_the_docs_show_the_same() -> None:
    doc = transitions.__doc__ or ""
    drawn = doc.split("the transitions between them:\n\n")[1].split("\n\n`TABLE`")[0]
    diagram = "\n".join(line.removeprefix("    ") for line in drawn.splitlines())
    assert diagram in DOC.read_text()
    for stage in JobStage:
        assert stage.value in diagram, stage
    for trigger in Trigger:
        assert trigger.value in diagram, trigger


def test_the_docs_list_every_detector() -> None:
    text = DOC.read_text()
    for detector in DETECTORS:
        assert f"| `{detector.name}` |" in text, detector.name
