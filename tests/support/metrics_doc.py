"""docs/metrics.md's tables, and a scrape parsed the same way, for the exporters' tests."""

from __future__ import annotations

import re
import shutil
import subprocess
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from support.paths import REPO

DOC = REPO / "docs" / "metrics.md"
ROW = re.compile(r"^\|\s*`(stalwart_[a-z0-9_]+)`\s*\|\s*(gauge|counter|histogram)\s*\|\s*([^|]*)\|")


def documented(section: str) -> dict[str, tuple[str, set[str]]]:
    """Metric -> (type, labels) from the table under `## {section}`."""
    out: dict[str, tuple[str, set[str]]] = {}
    current = None
    for line in DOC.read_text().splitlines():
        if line.startswith("## "):
            current = line[3:].strip()
        m = ROW.match(line)
        if m and current == section:
            out[m.group(1)] = (m.group(2), set(re.findall(r"`([a-z_]+)`", m.group(3))))
    return out


def families(text: str) -> dict[str, tuple[str, list[dict[str, str]]]]:
    """Documented name (counters with `_total`) -> (type, label sets of its samples, `le` dropped)."""
    out: dict[str, tuple[str, list[dict[str, str]]]] = {}
    for family in text_string_to_metric_families(text):
        if family.name.endswith("_created"):
            continue  # prometheus_client's creation timestamps of counters and histograms
        name = family.name + "_total" if family.type == "counter" else family.name
        entry = out.setdefault(name, (family.type, []))
        for s in family.samples:
            if s.name.endswith("_created"):
                continue
            entry[1].append({k: v for k, v in s.labels.items() if k != "le"})
    return out


def scrape_families(url: str) -> dict[str, tuple[str, list[dict[str, str]]]]:
    with urllib.request.urlopen(url, timeout=10) as resp:
        assert resp.status == 200
        return families(resp.read().decode())


def sample(text: str, name: str, **labels: str) -> float | None:
    """The value of the sample `name` with exactly these labels, or None if it is not served."""
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and dict(s.labels) == labels:
                return float(s.value)
    return None


def promtool_check(text: bytes) -> str:
    """`promtool check metrics` on an exporter's output: no name breaks Prometheus's naming rules."""
    promtool = shutil.which("promtool")
    assert promtool, "promtool is missing: `make install` installs Debian's prometheus package (as root)"
    out = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, timeout=60)
    assert out.returncode == 0, (out.stdout + out.stderr).decode()
    return (out.stdout + out.stderr).decode()
