"""The Helm chart rendered offline (helm-python-sdk: the Helm v4 SDK, no helm binary), once per
set of values per test session: rendering is cheap, loading the library is not free."""

from __future__ import annotations

import copy
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


# libyaml's loader: the pure-Python one spent most of the chart tests' CPU parsing the same text again.
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


@functools.cache
def _crds() -> tuple[dict[str, Any], ...]:
    return tuple(d for p in sorted((CHART / "crds").glob("*.yaml")) for d in yaml.load_all(p.read_text(), _LOADER) if d)


@functools.cache
def _render(values_json: str) -> tuple[dict[str, Any], ...]:
    from helm_python import Chart

    with Chart.load(CHART) as chart:
        rendered = chart.render(values=json.loads(values_json), name=RELEASE, namespace=NAMESPACE, is_install=True)
    texts = [text for path, text in sorted(rendered.items()) if path.endswith((".yaml", ".yml"))]
    return tuple(d for text in texts for d in yaml.load_all(text, _LOADER) if d)


def render(values: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Every manifest of an install with these values: the CRDs (crds/) and the templates. Rendered
    and parsed once per value set per session; each caller gets its own copy to change."""
    return copy.deepcopy([*_crds(), *_render(json.dumps(values or {}, sort_keys=True))])


def notes(values: dict[str, Any] | None = None) -> str:
    from helm_python import Chart

    with Chart.load(CHART) as chart:
        rendered = chart.render(values=values or {}, name=RELEASE, namespace=NAMESPACE, is_install=True)
    return next(text for path, text in rendered.items() if path.endswith("NOTES.txt"))
