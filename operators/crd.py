"""The TrainingJob CustomResourceDefinition, generated from the pydantic models.

The spec model (stalwart.spec.model) and the status model (stalwart_operator.status) are the one
source; this module turns their JSON Schema into the structural OpenAPI v3 schema that Kubernetes
wants: references inlined, `anyOf [X, null]` turned into `nullable`, JSON-Schema-2020 exclusive
bounds turned into OpenAPI 3.0 booleans, every default as a `default:` (so `kubectl get -o yaml`
shows it; objects default to `{}` when something inside them has a default) and in the description
(for `kubectl explain`), every string, list and map bounded, the fields of a role's pod `template`
in Kubernetes' own schemas (stalwart_operator.kube_structural), and CEL rules for what a schema
alone cannot say.

Regenerate the committed YAML with:  python -m stalwart_operator.crd > charts/stalwart/crds/trainingjobs.yaml
"""

from __future__ import annotations

import copy
import json
import sys
from typing import Any

import yaml
from pydantic import BaseModel

from stalwart.spec.kubernetes import SHAPE_KEY
from stalwart.spec.model import AGENT_CONTAINER, RESERVED_PREFIX, FaultTolerance, Role, TrainingJobSpec
from stalwart_operator import names
from stalwart_operator.kube_structural import field_schema
from stalwart_operator.pods import OPERATOR_ENV, OPERATOR_VOLUMES
from stalwart_operator.status import TrainingJobStatus

Schema = dict[str, Any]

# Bounds for what the models leave open: the API server needs them to estimate CEL costs and to
# refuse absurd objects early.
DEFAULT_MAX_STRING = 4096
DEFAULT_MAX_ITEMS = 1024
DEFAULT_MAX_PROPERTIES = 256
DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"

_DROP = {"title", "default", "examples", "additionalProperties", "$defs"}


class SchemaError(ValueError):
    """The model uses a JSON Schema construct a structural schema cannot express."""


def _describe_default(description: str | None, default: Any) -> str | None:
    """'... Default: 5.' for scalar defaults; objects and empty values say nothing new."""
    if default is None or isinstance(default, dict | list) or (description and "Default:" in description):
        return description
    shown = json.dumps(default) if not isinstance(default, str) else default
    return f"{description.rstrip('.')}. Default: {shown}." if description else f"Default: {shown}."


def _resolve(node: Schema, defs: dict[str, Schema]) -> Schema:
    """Inline a $ref (or pydantic's single-item allOf), keeping the referring node's own keys."""
    if "allOf" in node and len(node["allOf"]) == 1:
        node = {**{k: v for k, v in node.items() if k != "allOf"}, **node["allOf"][0]}
    if "$ref" not in node:
        return node
    name = node["$ref"].rsplit("/", 1)[-1]
    target = copy.deepcopy(defs[name])
    own = {k: v for k, v in node.items() if k != "$ref"}
    if "description" in own or "description" not in target:
        target.pop("description", None)
    return {**target, **own}


def _kubernetes_field(node: Schema) -> Schema:
    """A field the model declares as Kubernetes' own: Kubernetes' schema, the model's bounds."""
    out = field_schema(node[SHAPE_KEY])
    for key in ("maxItems", "maxProperties"):
        if key in node:
            out[key] = node[key]
    if node.get("description"):
        out["description"] = node["description"]
    if "anyOf" in node and any(o.get("type") == "null" for o in node["anyOf"]):
        out["nullable"] = True
    return out


def _schema_default(default: Any, out: Schema) -> Any:
    """The `default:` for a node, or None: scalars as they are; an object whose fields have
    defaults as {} (the API server then fills those in); no empty lists, maps or nulls."""
    if default is None or isinstance(default, list):
        return None
    if isinstance(default, dict):
        props = out.get("properties") or {}
        return {} if any("default" in p for p in props.values()) else None
    return default


def convert(node: Schema, defs: dict[str, Schema], path: str = "") -> Schema:
    """One JSON Schema node (pydantic's output) as a structural OpenAPI v3 schema node."""
    node = _resolve(node, defs)
    default = node.get("default")
    shape = node.get(SHAPE_KEY) or next((o.get(SHAPE_KEY) for o in node.get("anyOf", []) if SHAPE_KEY in o), None)
    if shape is not None:
        return _kubernetes_field({**node, SHAPE_KEY: shape})
    nullable = False
    if "anyOf" in node:
        options = [o for o in node["anyOf"] if o.get("type") != "null"]
        nullable = len(options) < len(node["anyOf"])
        if len(options) != 1:
            raise SchemaError(f"{path or '(root)'}: a union of {len(options)} types has no structural form")
        inner = _resolve(options[0], defs)
        node = {**inner, **{k: v for k, v in node.items() if k != "anyOf"}}
        if "description" not in node and "description" in inner:
            node["description"] = inner["description"]
    if "const" in node:
        node["enum"] = [node.pop("const")]
    out: Schema = {}
    description = _describe_default(node.get("description"), default)
    if description:
        out["description"] = description
    if "enum" in node:
        out["type"] = node.get("type", "string")
        out["enum"] = list(node["enum"])
    elif "type" in node:
        out["type"] = node["type"]
    else:
        raise SchemaError(f"{path or '(root)'}: no type")
    if nullable:
        out["nullable"] = True
    for key in (
        "minimum",
        "maximum",
        "minLength",
        "maxLength",
        "minItems",
        "maxItems",
        "minProperties",
        "maxProperties",
        "pattern",
        "format",
        "required",
    ):
        if key in node:
            out[key] = node[key]
    for bound, plain in (
        ("exclusiveMinimum", "minimum"),
        ("exclusiveMaximum", "maximum"),
    ):
        if bound in node and not isinstance(node[bound], bool):
            out[plain] = node[bound]
            out[bound] = True
    kind = out["type"]
    if kind == "object":
        if "properties" in node:
            out["properties"] = {k: convert(v, defs, f"{path}.{k}") for k, v in node["properties"].items()}
        elif isinstance(node.get("additionalProperties"), dict):
            out["additionalProperties"] = convert(node["additionalProperties"], defs, f"{path}[*]")
            out.setdefault("maxProperties", DEFAULT_MAX_PROPERTIES)
        else:
            out["x-kubernetes-preserve-unknown-fields"] = True
    elif kind == "array":
        out["items"] = convert(node["items"], defs, f"{path}[]")
        out.setdefault("maxItems", DEFAULT_MAX_ITEMS)
    elif kind == "string" and "enum" not in out:
        out.setdefault("maxLength", DEFAULT_MAX_STRING)
    leftover = (
        set(node)
        - set(out)
        - _DROP
        - {
            "properties",
            "items",
            "anyOf",
            "exclusiveMinimum",
            "exclusiveMaximum",
            "enum",
            "const",
            "type",
            "description",
        }
    )
    if leftover:
        raise SchemaError(f"{path or '(root)'}: unhandled JSON Schema keys {sorted(leftover)}")
    schema_default = _schema_default(default, out)
    if schema_default is not None:
        out["default"] = schema_default
    return out


def model_schema(model: type[BaseModel]) -> Schema:
    raw = model.model_json_schema(by_alias=True, mode="validation")
    return convert(raw, raw.get("$defs", {}))


def _ft_defaults() -> tuple[float, int]:
    fields = FaultTolerance.model_fields
    return float(fields["heartbeat_interval_seconds"].default), int(fields["lease_ttl_seconds"].default)


_replicas = f"(has(self.replicas) ? self.replicas : {Role.model_fields['replicas'].default})"


def _names_rule(what: str, reserved: list[str]) -> dict[str, str]:
    return {
        "rule": f"self.all(x, !(x.name in {json.dumps(reserved)}))",
        "message": f"{what} {', '.join(reserved)} are the operator's: use other names",
    }


def _template_rules(template: Schema) -> None:
    """What the operator keeps for itself in a role's pod template: its labels and annotations,
    its environment variables and its volumes."""
    metadata = template["properties"]["metadata"]["properties"]
    for key in ("labels", "annotations"):
        metadata[key]["x-kubernetes-validations"] = [
            {
                "rule": f"self.all(k, !k.startsWith('{RESERVED_PREFIX}'))",
                "message": f"{key} under {RESERVED_PREFIX} are the operator's",
            }
        ]
    pod = template["properties"]["spec"]["properties"]
    pod["volumes"]["x-kubernetes-validations"] = [_names_rule("volumes", sorted(OPERATOR_VOLUMES))]
    containers = pod["containers"]
    containers["x-kubernetes-list-type"] = "map"
    containers["x-kubernetes-list-map-keys"] = ["name"]
    container = containers["items"]["properties"]
    container["env"]["x-kubernetes-validations"] = [_names_rule("environment variables", sorted(OPERATOR_ENV))]
    assert container["name"]["enum"] == [AGENT_CONTAINER]


def _parallelism_rules() -> list[Schema]:
    """The role's parallelism must split its world (replicas x processesPerNode), as the model checks."""

    def field(obj: str, name: str, default: object = 1) -> str:
        return f"(has({obj}.{name}) ? {obj}.{name} : {default})"

    p = "self.parallelism"
    ppn = Role.model_fields["processes_per_node"].default
    world = f"({_replicas} * {field('self', 'processesPerNode', ppn)})"
    model = f"({field(p, 'tensor')} * {field(p, 'context')} * {field(p, 'pipeline')})"
    fits = f"{world} % {model} == 0"
    expert = f"({world} / {model}) % {field(p, 'expert')} == 0"
    return [
        {
            "rule": f"!has(self.parallelism) || {fits}",
            "message": "parallelism.tensor x context x pipeline must divide replicas x processesPerNode "
            "(data parallelism is what is left)",
        },
        {
            "rule": f"!has(self.parallelism) || !({fits}) || {expert}",
            "message": "parallelism.expert must divide the data-parallel size",
        },
    ]


def spec_schema() -> Schema:
    """The spec's schema plus what the JSON Schema cannot carry: list semantics and CEL rules."""
    spec = model_schema(TrainingJobSpec)
    spec["description"] = (
        "A training job: its roles (groups of nodes), fault tolerance, failure policy, "
        "warm standbys, checkpoints, data and scheduling."
    )
    props = spec["properties"]
    roles = props["roles"]
    # Named lists, as in Kubeflow Trainer and JobSet: the API server keeps names unique.
    roles["x-kubernetes-list-type"] = "map"
    roles["x-kubernetes-list-map-keys"] = ["name"]
    role = roles["items"]["properties"]
    role["name"]["maxLength"] = 63
    role["name"]["pattern"] = DNS_LABEL
    role["env"]["x-kubernetes-validations"] = [
        {
            "rule": "self.all(k, k.matches('^[A-Za-z_][A-Za-z0-9_]*$'))",
            "message": "env names must be valid environment variable names ([A-Za-z_][A-Za-z0-9_]*)",
        }
    ]
    roles["items"]["x-kubernetes-validations"] = [
        {
            "rule": f"(has(self.minReplicas) ? self.minReplicas : 1) <= {_replicas} && "
            f"{_replicas} <= (has(self.maxReplicas) ? self.maxReplicas : {_replicas})",
            "message": "elastic bounds: minReplicas <= replicas <= maxReplicas",
        },
        *_parallelism_rules(),
    ]
    _template_rules(role["template"])
    props["managedBy"]["x-kubernetes-validations"] = [
        {"rule": "self == oldSelf", "message": "managedBy cannot change while the job exists"}
    ]
    rules = props["failurePolicy"]["properties"]["rules"]
    rules["x-kubernetes-list-type"] = "map"
    rules["x-kubernetes-list-map-keys"] = ["event"]
    heartbeat, lease = _ft_defaults()
    props["faultTolerance"]["x-kubernetes-validations"] = [
        {
            "rule": f"double(has(self.leaseTtlSeconds) ? self.leaseTtlSeconds : {lease}) >= "
            f"2.0 * (has(self.heartbeatIntervalSeconds) ? self.heartbeatIntervalSeconds : {heartbeat})",
            "message": "leaseTtlSeconds must be at least twice heartbeatIntervalSeconds",
        }
    ]
    spec["x-kubernetes-validations"] = [
        {
            "rule": "self.roles == oldSelf.roles",
            "message": "roles cannot change while the job exists: delete the TrainingJob and create it again",
        }
    ]
    return spec


def status_schema() -> Schema:
    status = model_schema(TrainingJobStatus)
    conditions = status["properties"]["conditions"]
    conditions["x-kubernetes-list-type"] = "map"
    conditions["x-kubernetes-list-map-keys"] = ["type"]
    return status


def openapi_schema() -> Schema:
    return {
        "type": "object",
        "description": "A Stalwart TrainingJob: a fault-tolerant distributed training job. "
        "See docs/kubernetes.md in the Stalwart repository.",
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string", "description": "stalwart.dev/v1alpha1"},
            "kind": {"type": "string", "description": "TrainingJob"},
            "metadata": {"type": "object"},
            "spec": spec_schema(),
            "status": status_schema(),
        },
        "x-kubernetes-validations": [
            {
                "rule": f"self.metadata.name.size() <= 63 && self.metadata.name.matches('{DNS_LABEL}')",
                "message": "a TrainingJob's name must be a DNS-1123 label (lowercase letters, digits and '-', "
                "at most 63 characters): it names pods, a Service and etcd keys",
            }
        ],
    }


PRINTER_COLUMNS = [
    {"name": "Phase", "type": "string", "jsonPath": ".status.phase", "description": "The job's phase."},
    {"name": "Step", "type": "integer", "jsonPath": ".status.currentStep", "description": "Newest training step."},
    {
        "name": "Nodes",
        "type": "string",
        "jsonPath": ".status.nodesReady",
        "description": "Running slots / slots.",
    },
    {
        "name": "Restarts",
        "type": "integer",
        "jsonPath": ".status.restarts.total",
        "description": "Restarts of the workers, whatever the cause.",
    },
    {"name": "ETTR", "type": "number", "jsonPath": ".status.ettr", "description": "Effective training time ratio."},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    {
        "name": "Counted",
        "type": "integer",
        "jsonPath": ".status.restarts.counted",
        "priority": 1,
        "description": "Restarts counted against failurePolicy.maxRestarts.",
    },
    {"name": "Generation", "type": "integer", "jsonPath": ".status.currentGeneration", "priority": 1},
    {
        "name": "Roles",
        "type": "string",
        "jsonPath": ".status.rolesReady",
        "priority": 1,
        "description": "Running slots / slots of each role.",
    },
    {
        "name": "Standbys",
        "type": "integer",
        "jsonPath": ".status.standbyCounts.ready",
        "priority": 1,
        "description": "Warm standbys ready to take a slot.",
    },
    {"name": "Incident", "type": "string", "jsonPath": ".status.lastIncident.class", "priority": 1},
    {
        "name": "Job-ID",
        "type": "string",
        "jsonPath": ".status.jobId",
        "priority": 1,
        "description": "The job's name for the stalwart CLI.",
    },
]


def crd() -> Schema:
    """The whole CustomResourceDefinition document."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": names.CRD_NAME,
            "labels": {"app.kubernetes.io/name": "stalwart", "app.kubernetes.io/component": "crd"},
        },
        "spec": {
            "group": names.GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": names.KIND,
                "listKind": f"{names.KIND}List",
                "plural": names.PLURAL,
                "singular": names.SINGULAR,
                "shortNames": list(names.SHORT_NAMES),
                "categories": ["stalwart"],
            },
            "versions": [
                {
                    "name": names.VERSION,
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": openapi_schema()},
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": PRINTER_COLUMNS,
                }
            ],
        },
    }


HEADER = (
    "# Generated from the pydantic models (stalwart.spec.model, stalwart_operator.status); do not edit.\n"
    "# Regenerate: python -m stalwart_operator.crd > charts/stalwart/crds/trainingjobs.yaml\n"
)


def render() -> str:
    return HEADER + yaml.safe_dump(crd(), sort_keys=False, width=100, allow_unicode=True)


def main() -> None:
    sys.stdout.write(render())


if __name__ == "__main__":
    main()
