"""The Helm chart rendered offline (helm-python-sdk: the Helm v4 SDK, no helm binary), once per
set of values per test session: rendering is cheap, loading the library is not free."""

from __future__ import annotations

import functools
import json
from typing import Any

import yaml

from support.paths import REPO

CHART = REPO / "charts" / "stalwart"
RELEASE, NAMESPACE = "stalwart", "stalwart"

# The value sets the chart's tests render (tests/unit/chart/): the default, and the others users run.
VALUE_SETS: dict[str, dict[str, Any]] = {
    "default": {},
    "monitored-with-console": {
        "console": {"enabled": True},
        "monitoring": {
            "serviceMonitor": {"enabled": True, "labels": {"release": "kube-prometheus"}},
            "podMonitor": {"enabled": True},
            "prometheusRule": {"enabled": True, "runbookBaseUrl": "https://git.example/stalwart/blob/main"},
        },
        "operator": {"namespaces": ["ml", "research"]},
    },
    "external-etcd-minimal": {
        "etcd": {
            "mode": "external",
            "external": {"endpoint": "etcd.infra.svc:2379"},
            "tls": {"clientSecret": "etcd-client"},
        },
        "diagnosis": {"enabled": False},
        "monitoring": {"dashboard": {"enabled": False}},
        "operator": {"replicas": 3},
    },
    "own-certificates-no-console": {
        "etcd": {"replicas": 1, "tls": {"serverSecret": "etcd-members", "clientSecret": "etcd-client"}},
        "networkPolicy": {"prometheus": {"namespaceSelector": {"matchLabels": {"team": "monitoring"}}}},
        "operator": {"namespaces": ["stalwart", "ml"]},
    },
}


@functools.cache
def _render(values_json: str) -> tuple[str, ...]:
    from helm_python import Chart

    with Chart.load(CHART) as chart:
        rendered = chart.render(values=json.loads(values_json), name=RELEASE, namespace=NAMESPACE, is_install=True)
    return tuple(text for path, text in sorted(rendered.items()) if path.endswith((".yaml", ".yml")))


def render(values: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Every manifest of an install with these values: the CRDs (crds/) and the templates."""
    crds = [d for p in sorted((CHART / "crds").glob("*.yaml")) for d in yaml.safe_load_all(p.read_text()) if d]
    docs = [d for text in _render(json.dumps(values or {}, sort_keys=True)) for d in yaml.safe_load_all(text) if d]
    return crds + docs


def notes(values: dict[str, Any] | None = None) -> str:
    from helm_python import Chart

    with Chart.load(CHART) as chart:
        rendered = chart.render(values=values or {}, name=RELEASE, namespace=NAMESPACE, is_install=True)
    return next(text for path, text in rendered.items() if path.endswith("NOTES.txt"))
