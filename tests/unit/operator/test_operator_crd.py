"""The TrainingJob CRD: generated from the pydantic models, committed, structural, valid for
Kubernetes, and it accepts the example jobs and refuses broken ones with a message."""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from support.paths import REPO

from stalwart.spec import SpecError, parse_job
from stalwart_operator import crd, names

CRD_FILE = REPO / "charts" / "stalwart" / "crds" / "trainingjobs.yaml"
EXAMPLES = sorted((REPO / "examples" / "k8s").glob("*.yaml"))
INVALID = REPO / "tests" / "data" / "operator" / "invalid"
K8S_VERSION = "1.30"


def openapi() -> dict[str, Any]:
    return crd.crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]  # type: ignore[no-any-return]


def as_json_schema(node: Any) -> Any:
    """OpenAPI 3.0 (nullable, boolean exclusive bounds, x-kubernetes-*) as JSON Schema, so that
    jsonschema can check documents against it the way the API server's OpenAPI validation does."""
    if isinstance(node, list):
        return [as_json_schema(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = {k: as_json_schema(v) for k, v in node.items() if not k.startswith("x-kubernetes-") and k != "nullable"}
    for bound, plain in (
        ("exclusiveMinimum", "minimum"),
        ("exclusiveMaximum", "maximum"),
    ):
        if node.get(bound) is True:
            out[bound] = out.pop(plain)
    if node.get("nullable"):
        out["type"] = [node["type"], "null"]
        if "enum" in out:
            out["enum"] = [*out["enum"], None]
    if node.get("type") == "object" and "properties" in node and not node.get("x-kubernetes-preserve-unknown-fields"):
        out["additionalProperties"] = False  # the API server prunes (or, with kubectl, refuses) unknown fields
    return out


def schema_errors(document: dict[str, Any]) -> list[str]:
    validator = jsonschema.Draft7Validator(as_json_schema(openapi()))
    return [
        f"{'.'.join(str(p) for p in e.absolute_path) or '(root)'}: {e.message}" for e in validator.iter_errors(document)
    ]


def structural_problems(node: dict[str, Any], path: str = "") -> list[str]:
    """Kubernetes' rules for a structural schema, the ones a generator could get wrong."""
    problems = []
    int_or_string = node.get("x-kubernetes-int-or-string") is True
    if int_or_string and node.get("anyOf") != [{"type": "integer"}, {"type": "string"}]:
        problems.append(f"{path}: int-or-string without its anyOf [integer, string]")
    for banned in (
        "$ref",
        *(() if int_or_string else ("anyOf",)),
        "oneOf",
        "allOf",
        "not",
        "definitions",
        "$defs",
        "title",
    ):
        if banned in node:
            problems.append(f"{path or '(root)'}: {banned} is not allowed here")
    if "type" not in node and not node.get("x-kubernetes-preserve-unknown-fields") and not int_or_string:
        problems.append(f"{path or '(root)'}: no type")
    if "properties" in node and "additionalProperties" in node:
        problems.append(f"{path}: properties and additionalProperties together")
    if node.get("additionalProperties") is False:
        problems.append(f"{path}: additionalProperties: false")
    if "default" in node and node["default"] is None and not node.get("nullable"):
        problems.append(f"{path}: null default")
    kind = node.get("type")
    if kind == "array" and "maxItems" not in node:
        problems.append(f"{path}: unbounded list")
    if kind == "string" and not ({"maxLength", "enum"} & set(node)) and path.startswith(".spec"):
        problems.append(f"{path}: unbounded string")
    for name, child in (node.get("properties") or {}).items():
        problems += structural_problems(child, f"{path}.{name}")
    if isinstance(node.get("items"), dict):
        problems += structural_problems(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        problems += structural_problems(node["additionalProperties"], f"{path}{{}}")
    if node.get("x-kubernetes-list-type") == "map":
        for key in node["x-kubernetes-list-map-keys"]:
            if key not in node["items"].get("required", []):
                problems.append(f"{path}: list-map key {key} must be required")
    return problems


def load(path: Path) -> dict[str, Any]:
    return yaml.safe_load(path.read_text())  # type: ignore[no-any-return]


def test_the_committed_crd_is_generated_from_the_models() -> None:
    assert CRD_FILE.read_text() == crd.render(), (
        "charts/stalwart/crds/trainingjobs.yaml differs from the models: "
        "run `python -m stalwart_operator.crd > charts/stalwart/crds/trainingjobs.yaml`"
    )
    out = subprocess.run(
        [sys.executable, "-m", "stalwart_operator.crd"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout == crd.render()


def test_the_crd_is_a_valid_kubernetes_object() -> None:
    document = load(CRD_FILE)
    kubernetes_validate.validate(document, K8S_VERSION, strict=True)
    spec = document["spec"]
    assert spec["group"] == "stalwart.dev" and spec["scope"] == "Namespaced"
    assert spec["names"]["shortNames"] == ["tj"] and spec["names"]["plural"] == "trainingjobs"
    [version] = spec["versions"]
    assert version["name"] == "v1alpha1" and version["served"] and version["storage"]
    assert version["subresources"] == {"status": {}}
    columns = {c["name"]: c["jsonPath"] for c in version["additionalPrinterColumns"]}
    assert columns["Phase"] == ".status.phase" and columns["Step"] == ".status.currentStep"
    assert columns["Restarts"] == ".status.restarts.total" and columns["ETTR"] == ".status.ettr"
    assert columns["Age"] == ".metadata.creationTimestamp"


def test_the_schema_is_structural_and_bounded() -> None:
    assert structural_problems(openapi()) == []


def test_descriptions_reach_kubectl_explain() -> None:
    spec = openapi()["properties"]["spec"]["properties"]
    role = spec["roles"]["items"]["properties"]
    assert "nodes" in role["replicas"]["description"] and "Default: 1." in role["replicas"]["description"]
    assert spec["failurePolicy"]["properties"]["maxRestarts"]["description"].startswith("Restarts the job's own")
    status = openapi()["properties"]["status"]["properties"]
    assert "infrastructure" in status["restarts"]["properties"]["infrastructure"]["description"]
    assert set(status["conditions"]["items"]["properties"]["type"]["enum"]) == {
        "Created",
        "Running",
        "Restarting",
        "Complete",
        "Succeeded",
        "Failed",
        "Suspended",
    }


def test_defaults_times_and_conditions_follow_the_kubernetes_conventions() -> None:
    """`default:` for every defaulted field (objects default to {} so theirs apply), RFC 3339
    times as date-time, conditions with observedGeneration, and the pod template in Kubernetes'
    own schemas (quantities as int-or-string, secretKeyRef under env)."""
    spec = openapi()["properties"]["spec"]
    ft = spec["properties"]["faultTolerance"]
    assert ft["default"] == {} and ft["properties"]["leaseTtlSeconds"]["default"] == 5
    role = spec["properties"]["roles"]["items"]["properties"]
    assert role["replicas"]["default"] == 1 and role["restartScope"]["default"] == "Job"
    assert role["resources"]["default"] == {} and role["resources"]["properties"]["gpus"]["default"] == 0
    assert spec["properties"]["managedBy"]["default"] == "stalwart.dev/operator"
    assert "default" not in role["env"] and "default" not in spec["properties"]["checkpoint"]["properties"]["uri"]

    def defaults(node: dict[str, Any], path: str = "") -> list[str]:
        out = [path] if "default" in node else []
        for name, child in (node.get("properties") or {}).items():
            out += defaults(child, f"{path}.{name}")
        if isinstance(node.get("items"), dict):
            out += defaults(node["items"], f"{path}[]")
        return out

    # Every scalar default of the model is in the schema.
    from stalwart.spec.model import FailurePolicy, FaultTolerance, StandbySettings, TrainingJobSpec

    found = set(defaults(spec))
    for prefix, model in (
        (".faultTolerance", FaultTolerance),
        (".failurePolicy", FailurePolicy),
        (".standbys", StandbySettings),
    ):
        for name, field in model.model_fields.items():
            alias = field.alias or name
            if field.default is not None and not isinstance(field.default, list | dict):
                assert f"{prefix}.{alias}" in found, f"{prefix}.{alias} has no default in the schema"
    assert ".suspend" in found and ".cleanPodPolicy" in found and TrainingJobSpec.model_fields["suspend"]
    status = openapi()["properties"]["status"]["properties"]
    condition = status["conditions"]["items"]["properties"]
    assert condition["lastTransitionTime"]["format"] == "date-time"
    assert condition["observedGeneration"]["type"] == "integer"
    for key in ("startTime", "completionTime"):
        assert status[key]["format"] == "date-time"
    assert status["lastIncident"]["properties"]["at"]["format"] == "date-time"
    container = role["template"]["properties"]["spec"]["properties"]["containers"]["items"]["properties"]
    env = container["env"]["items"]["properties"]
    assert env["valueFrom"]["properties"]["secretKeyRef"]["required"] == ["key"]
    limits = container["resources"]["properties"]["limits"]["additionalProperties"]
    assert limits["x-kubernetes-int-or-string"] is True
    caps = container["securityContext"]["properties"]["capabilities"]["properties"]["add"]
    assert caps["type"] == "array" and caps["items"]["type"] == "string"
    pod = role["template"]["properties"]["spec"]["properties"]
    assert {"affinity", "tolerations", "topologySpreadConstraints", "volumes", "hostNetwork"} <= set(pod)


def test_the_crd_stays_small_enough_for_a_plain_kubectl_apply() -> None:
    """kubectl's client-side apply keeps the object in an annotation (256 KiB at most)."""
    import json

    assert len(json.dumps(crd.crd(), separators=(",", ":"))) < 200_000


def test_the_kubernetes_schemas_are_the_generated_extract() -> None:
    from stalwart_operator import kube_schemas

    committed = (REPO / "platform" / "spec" / "kubernetes-fields.json").read_text()
    assert committed == kube_schemas.render(), (
        "platform/spec/kubernetes-fields.json differs: "
        "run `python -m stalwart_operator.kube_schemas > platform/spec/kubernetes-fields.json`"
    )


def test_named_lists_and_cel_rules() -> None:
    spec = openapi()["properties"]["spec"]
    roles = spec["properties"]["roles"]
    assert roles["x-kubernetes-list-type"] == "map" and roles["x-kubernetes-list-map-keys"] == ["name"]
    rules = spec["properties"]["failurePolicy"]["properties"]["rules"]
    assert rules["x-kubernetes-list-map-keys"] == ["event"]
    cel = spec["properties"]["faultTolerance"]["x-kubernetes-validations"][0]
    assert "leaseTtlSeconds" in cel["rule"] and "2.0 *" in cel["rule"] and cel["message"]
    assert spec["x-kubernetes-validations"][0]["rule"] == "self.roles == oldSelf.roles"
    root = openapi()["x-kubernetes-validations"][0]["rule"]
    assert "self.metadata.name.size() <= 63" in root  # evaluated in test_operator_cel.py
    # The enums come from the model: every failure event and action, nothing else.
    rule = rules["items"]["properties"]
    assert "Evict" in rule["action"]["enum"] and "LostNode" in rule["event"]["enum"]


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_the_examples_validate(path: Path) -> None:
    """TrainingJobs against the CRD's schema and the model; anything else (the S3 Secret) against
    Kubernetes' own schemas; the pods the operator makes of each job in test_operator_manifests."""
    documents = [d for d in yaml.safe_load_all(path.read_text()) if d]
    assert documents
    for document in documents:
        if document["kind"] == names.KIND:
            assert schema_errors(document) == []
            parse_job(document, str(path))  # and the controller's own model agrees
        else:
            kubernetes_validate.validate(document, K8S_VERSION, strict=True)


def _entry(command: list[str], folder: Path) -> str:
    """What a role's command runs: `-m module`, or the script's path relative to examples/."""
    if "-m" in command:
        return "-m " + command[command.index("-m") + 1]
    script = next(c for c in command[1:] if c.endswith(".py"))
    return str((folder / script).resolve().relative_to(REPO / "examples"))


def test_the_kubernetes_rlhf_example_runs_the_grpo_examples_modules() -> None:
    """examples/k8s/rlhf-volcano.yaml runs what `stalwart run examples/rlhf/grpo.yaml` runs: the same
    roles, scripts and modules (the image copies examples/ to /workspace, the pods' job folder), each
    role restarted alone; every script exists and every module imports. Its standbys are per role."""
    import importlib.util

    local = parse_job(load(REPO / "examples" / "rlhf" / "grpo.yaml"))
    cluster = parse_job(load(REPO / "examples" / "k8s" / "rlhf-volcano.yaml"))
    here = {r.name: _entry(r.command, REPO / "examples" / "rlhf") for r in local.spec.roles}
    there = {r.name: _entry(r.command, REPO / "examples") for r in cluster.spec.roles}  # /workspace
    assert there == here, (there, here)
    for entry in here.values():
        if entry.startswith("-m "):
            assert importlib.util.find_spec(entry[3:]) is not None, entry
        else:
            assert (REPO / "examples" / entry).is_file(), entry
    assert {r.restart_scope.value for r in cluster.spec.roles} == {"Role"} and cluster.spec.data_plane is not None
    assert {r.name: r.standbys for r in cluster.spec.roles if r.standbys} == {"actor": 1, "rollout": 1}
    assert cluster.spec.standbys.count == 0  # no role without its own pool gets one


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("missing-roles.yaml", "'roles' is a required property"),
        ("zero-replicas.yaml", "0 is less than the minimum of 1"),
        ("unknown-action.yaml", "'Reboot' is not one of"),
    ],
)
def test_invalid_jobs_are_rejected_with_a_message(name: str, expected: str) -> None:
    document = load(INVALID / name)
    errors = schema_errors(document)
    assert any(expected in e for e in errors), errors
    with pytest.raises(SpecError):  # the model refuses it too (for API servers without the CRD's checks)
        parse_job(document, name)


def test_unknown_fields_and_bad_values_are_refused() -> None:
    good = load(REPO / "examples" / "k8s" / "pretrain-tiny.yaml")
    typo = copy.deepcopy(good)
    typo["spec"]["roles"][0]["procsPerNode"] = 2
    assert any("procsPerNode" in e for e in schema_errors(typo))
    bad_scope = copy.deepcopy(good)
    bad_scope["spec"]["roles"][0]["restartScope"] = "Node"
    assert any("restartScope" in e for e in schema_errors(bad_scope))
    bad_name = copy.deepcopy(good)
    bad_name["spec"]["roles"][0]["name"] = "Trainer_1"
    assert any("does not match" in e for e in schema_errors(bad_name))
    # The template is Kubernetes' own shape: its schema refuses what the API server would.
    bad_env = copy.deepcopy(good)
    bad_env["spec"]["roles"][0]["template"]["spec"]["containers"][0]["env"][0]["valueFrom"] = {
        "secretKeyRef": {"name": "s3"}  # no key
    }
    assert any("'key' is a required property" in e for e in schema_errors(bad_env))
    with pytest.raises(SpecError, match="'key' is a required property"):
        parse_job(bad_env)
    bad_container = copy.deepcopy(good)
    bad_container["spec"]["roles"][0]["template"]["spec"]["containers"][0]["name"] = "sidecar"
    assert any("containers" in e for e in schema_errors(bad_container))
    with pytest.raises(SpecError, match="containers"):
        parse_job(bad_container)
    elastic = copy.deepcopy(good)
    elastic["spec"]["roles"][0]["minReplicas"] = 3  # replicas is 2
    with pytest.raises(SpecError, match="minReplicas"):
        parse_job(elastic)


def test_status_model_is_the_status_schema() -> None:
    status = openapi()["properties"]["status"]
    assert status == crd.status_schema()
    assert crd.crd()["spec"]["names"]["kind"] == names.KIND
