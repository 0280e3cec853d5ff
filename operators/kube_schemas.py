"""Kubernetes' own JSON Schemas for the pod fields a role may override, extracted from the schemas
that kubernetes-validate bundles (generated from the Kubernetes OpenAPI), never written by hand.

The spec model (stalwart.spec.kubernetes) validates a role's `template` against them, and the CRD
generator (stalwart_operator.crd) turns them into the structural schema of those fields. The
platform may not import a Kubernetes library, so the extract is committed next to the model as
package data; a test checks it is what this module generates.

Regenerate:  python -m stalwart_operator.kube_schemas > platform/spec/kubernetes-fields.json
"""

from __future__ import annotations

import json
import re
import sys
from importlib.resources import files
from typing import Any

# The oldest Kubernetes the CRD supports (docs/kubernetes.md); newer API servers accept its shapes.
KUBERNETES_VERSION = "1.30"
SCHEMA_SET = f"v{KUBERNETES_VERSION}.0-local-strict"

# The fields a role's `template` may set, as <Kubernetes type>.<field>.
FIELDS = (
    "PodSpec.serviceAccountName",
    "PodSpec.automountServiceAccountToken",
    "PodSpec.imagePullSecrets",
    "PodSpec.hostNetwork",
    "PodSpec.dnsPolicy",
    "PodSpec.affinity",
    "PodSpec.tolerations",
    "PodSpec.topologySpreadConstraints",
    "PodSpec.volumes",
    "PodSpec.securityContext",
    "Container.env",
    "Container.envFrom",
    "Container.volumeMounts",
    "Container.resources",
    "Container.securityContext",
)
PREFIX = "io.k8s.api.core.v1."
# Kubernetes' strategic-merge hints and generator markers mean nothing to a CRD.
_DROPPED = {"x-kubernetes-patch-strategy", "x-kubernetes-patch-merge-key", "x-kubernetes-group-version-kind"}
_SENTENCE = re.compile(r"^(.+?[.!?])(\s|$)", re.S)


def first_sentence(text: str) -> str:
    """Descriptions are trimmed to their first sentence: the whole text of every imported type would
    make the CRD too large for a plain `kubectl apply` (`kubectl explain pod.spec` has the rest)."""
    match = _SENTENCE.match(text.strip())
    return (match.group(1) if match else text.strip()).replace("\n", " ")


def _clean(node: Any) -> Any:
    if isinstance(node, list):
        return [_clean(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = {k: _clean(v) for k, v in node.items() if k not in _DROPPED}
    if isinstance(out.get("description"), str):
        out["description"] = first_sentence(out["description"])
    return out


def _refs(node: Any) -> set[str]:
    if isinstance(node, list):
        return set().union(*(_refs(n) for n in node)) if node else set()
    if not isinstance(node, dict):
        return set()
    found = {node["$ref"].rsplit("/", 1)[-1]} if "$ref" in node else set()
    return found.union(*(_refs(v) for k, v in node.items() if k != "$ref")) if node else found


def extract() -> dict[str, Any]:
    """The chosen fields' schemas and every definition they reach."""
    bundled = files("kubernetes_validate").joinpath("kubernetes-json-schema", SCHEMA_SET, "_definitions.json")
    defs: dict[str, Any] = json.loads(bundled.read_text())["$defs"]
    fields: dict[str, Any] = {}
    for field in FIELDS:
        owner, name = field.split(".")
        fields[field] = _clean(defs[PREFIX + owner]["properties"][name])
    wanted: dict[str, Any] = {}
    todo = sorted(_refs(list(fields.values())))
    while todo:
        name = todo.pop()
        if name in wanted:
            continue
        wanted[name] = _clean(defs[name])
        todo.extend(sorted(_refs(wanted[name]) - set(wanted)))
    return {
        "kubernetesVersion": KUBERNETES_VERSION,
        "source": f"kubernetes-validate, {SCHEMA_SET}",
        "fields": fields,
        "$defs": dict(sorted(wanted.items())),
    }


def render() -> str:
    return json.dumps(extract(), indent=1, sort_keys=False) + "\n"


def main() -> None:
    sys.stdout.write(render())


if __name__ == "__main__":
    main()
