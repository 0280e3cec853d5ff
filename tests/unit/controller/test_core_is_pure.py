"""The controller's core reads no clock, sleeps never and opens nothing.

The import contract `controller-core-is-pure` (.importlinter) keeps I/O modules out of the core's
imports; it cannot see calls, so this looks for them in the core's own source.
"""

from __future__ import annotations

import re
from pathlib import Path

import stalwart.controller.core

CORE = Path(stalwart.controller.core.__file__).parent
CALLS = re.compile(r"\btime\.(sleep|time|monotonic|perf_counter)\(|^\s*import time\b|\bopen\(|\bprint\(", re.M)


def test_the_core_has_no_clock_sleep_or_file_call() -> None:
    found = []
    for path in sorted(CORE.rglob("*.py")):
        text = path.read_text()
        found += [
            f"{path.relative_to(CORE)}:{text[: m.start()].count(chr(10)) + 1}: {m[0].strip()}"
            for m in CALLS.finditer(text)
        ]
    assert found == []


def test_the_search_finds_what_it_looks_for() -> None:
    assert CALLS.search("    time.sleep(1)\n") and CALLS.search("import time\n") and CALLS.search("with open(p):")
