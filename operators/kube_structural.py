"""Kubernetes' own field schemas (stalwart.spec.kubernetes: JSON Schema, as kubernetes-validate
bundles them) as the structural OpenAPI v3 a CRD needs, the way controller-gen writes embedded
Kubernetes types: references inlined, `[T, null]` types as T, quantities and int-or-strings as
`x-kubernetes-int-or-string`, `additionalProperties: false` left to pruning, and every string, list
and map bounded (the API server needs bounds to estimate CEL costs). The one free-form type,
FieldsV1 (in an embedded ObjectMeta's managedFields), keeps its unknown fields: no schema exists.
"""

from __future__ import annotations

import copy
from typing import Any

from stalwart.spec.kubernetes import kubernetes_fields

Schema = dict[str, Any]

MAX_STRING = 4096
MAX_ITEMS = 1024
MAX_PROPERTIES = 256
_INT_OR_STRING = {"io.k8s.apimachinery.pkg.api.resource.Quantity", "io.k8s.apimachinery.pkg.util.intstr.IntOrString"}
_KEPT = ("description", "format", "required", "x-kubernetes-list-type", "x-kubernetes-list-map-keys")
_KEPT_MAP = ("x-kubernetes-map-type",)


def _type(node: Schema) -> str | None:
    kind = node.get("type")
    if isinstance(kind, list):
        kinds = [k for k in kind if k != "null"]
        return kinds[0] if len(kinds) == 1 else None
    return str(kind) if kind is not None else None


def structural(node: Schema, defs: dict[str, Schema], path: str) -> Schema:
    """One node of a Kubernetes JSON Schema as a structural schema node."""
    ref = node.get("$ref")
    if ref is not None:
        name = ref.rsplit("/", 1)[-1]
        if name in _INT_OR_STRING:
            out: Schema = {"x-kubernetes-int-or-string": True, "anyOf": [{"type": "integer"}, {"type": "string"}]}
            if "description" in node:
                out["description"] = node["description"]
            return out
        target = copy.deepcopy(defs[name])
        if "description" in node:
            target["description"] = node["description"]
        return structural(target, defs, path)
    kind = _type(node)
    if kind is None:
        raise ValueError(f"{path}: no single type in {sorted(node)}")
    out = {"type": kind}
    for key in _KEPT:
        if key in node:
            out[key] = copy.deepcopy(node[key])
    if "enum" in node:
        out["enum"] = [v for v in node["enum"] if v is not None]
    if kind == "object":
        if "properties" in node:
            out["properties"] = {k: structural(v, defs, f"{path}.{k}") for k, v in node["properties"].items()}
        elif isinstance(node.get("additionalProperties"), dict):
            out["additionalProperties"] = structural(node["additionalProperties"], defs, f"{path}{{}}")
            out["maxProperties"] = MAX_PROPERTIES
            for key in _KEPT_MAP:
                if key in node:
                    out[key] = node[key]
        else:
            out["x-kubernetes-preserve-unknown-fields"] = True  # FieldsV1: free-form by definition
    elif kind == "array":
        out["items"] = structural(node["items"], defs, f"{path}[]")
        out["maxItems"] = MAX_ITEMS
    elif kind == "string" and "enum" not in out:
        out["maxLength"] = MAX_STRING
    if out.get("x-kubernetes-list-type") == "map":
        item_required = set(out["items"].get("required", []))
        if not set(out.get("x-kubernetes-list-map-keys", [])) <= item_required:
            # A CRD's list-map keys must be required; Kubernetes' own types do not always say so.
            out["x-kubernetes-list-type"] = "atomic"
            out.pop("x-kubernetes-list-map-keys", None)
    return out


def field_schema(field: str) -> Schema:
    """The structural schema of one Kubernetes field, e.g. "PodSpec.volumes"."""
    data = kubernetes_fields()
    return structural(data["fields"][field], data["$defs"], field)
