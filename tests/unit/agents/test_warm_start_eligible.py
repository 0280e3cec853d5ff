"""Which workers start warm (forked from the agent's interpreter, torch already imported): only a
script run by this interpreter. A script run by another environment's python (the user's image, a
second venv) must start cold, or it would run with the agent's packages instead of its own."""

from __future__ import annotations

import sys

from stalwart.agents.warm_start import warm_eligible


def test_only_this_interpreter_runs_a_script_warm() -> None:
    assert warm_eligible(["python", "train.py"])
    assert warm_eligible([sys.executable, "train.py"])
    assert not warm_eligible(["/opt/other-venv/bin/python", "train.py"])
    assert not warm_eligible(["python", "-m", "trainer"])
    assert not warm_eligible(["bash", "run.sh"])
