"""Every CEL rule of the CRD, evaluated (cel-python) as the API server would: on the values at its
place in the schema (each item of a list, each entry of a list-map), with `oldSelf` on an update.
Each rule has a document it accepts and one it refuses; a rule without both fails the suite."""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from functools import cache
from typing import Any

import celpy
import pytest
import yaml
from support.paths import REPO

from stalwart_operator import crd

Doc = dict[str, Any]
EXAMPLE = REPO / "examples" / "k8s" / "pretrain-tiny.yaml"


@cache
def schema() -> dict[str, Any]:
    return crd.crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]  # type: ignore[no-any-return]


def rules_at(node: dict[str, Any], path: str = "") -> Iterator[tuple[str, dict[str, str]]]:
    """(schema path, rule) for every rule: `.spec.roles[]` is each item of spec.roles."""
    for rule in node.get("x-kubernetes-validations") or []:
        yield path, rule
    for name, child in (node.get("properties") or {}).items():
        yield from rules_at(child, f"{path}.{name}")
    if isinstance(node.get("items"), dict):
        yield from rules_at(node["items"], f"{path}[]")


def values_at(document: Any, path: str) -> Iterator[Any]:
    """The values a rule at `path` applies to (none where the document has no such field)."""
    if not path:
        yield document
        return
    if path.startswith("[]"):
        for item in document if isinstance(document, list) else []:
            yield from values_at(item, path[2:])
        return
    name, rest = path[1:], ""
    for i, ch in enumerate(path[1:], 1):
        if ch in ".[":
            name, rest = path[1:i], path[i:]
            break
    if isinstance(document, dict) and name in document:
        yield from values_at(document[name], rest)


CEL = celpy.Environment()


def evaluate(rule: str, value: Any, old: Any = None) -> bool:
    activation = {"self": celpy.json_to_cel(value)}
    if old is not None:
        activation["oldSelf"] = celpy.json_to_cel(old)
    return bool(CEL.program(CEL.compile(rule)).evaluate(activation))


def refusals(document: Doc, old: Doc | None = None) -> list[str]:
    """The messages of the rules the document breaks (transition rules only on an update, on
    values present in both: a list-map's items matched by their keys, as the API server does)."""
    out = []
    for path, rule in rules_at(schema()):
        transition = "oldSelf" in rule["rule"]
        if transition and old is None:
            continue
        new_values = list(values_at(document, path))
        old_values = list(values_at(old, path)) if old is not None else []
        for i, value in enumerate(new_values):
            if transition:
                if path.endswith("[]") or i >= len(old_values):
                    continue
                if not evaluate(rule["rule"], value, old_values[i]):
                    out.append(rule["message"])
            elif not evaluate(rule["rule"], value):
                out.append(rule["message"])
    return out


def example() -> Doc:
    return yaml.safe_load(EXAMPLE.read_text())  # type: ignore[no-any-return]


def role(doc: Doc) -> Doc:
    return doc["spec"]["roles"][0]  # type: ignore[no-any-return]


def template(doc: Doc) -> Doc:
    return role(doc).setdefault("template", {"metadata": {}, "spec": {"containers": [{"name": "agent"}]}})  # type: ignore[no-any-return]


def _set(path: Callable[[Doc], Doc], key: str, value: Any) -> Callable[[Doc], None]:
    def change(doc: Doc) -> None:
        path(doc)[key] = value

    return change


def _env(name: str) -> Callable[[Doc], None]:
    def change(doc: Doc) -> None:
        template(doc)["spec"]["containers"][0]["env"] = [{"name": name, "value": "x"}]

    return change


def _volume(name: str) -> Callable[[Doc], None]:
    def change(doc: Doc) -> None:
        template(doc)["spec"]["volumes"] = [{"name": name, "emptyDir": {}}]

    return change


def _meta(key: str, value: dict[str, str]) -> Callable[[Doc], None]:
    def change(doc: Doc) -> None:
        template(doc)["metadata"][key] = value

    return change


# rule path -> (a change the rule accepts, a change it refuses, a word of its message)
CASES: dict[str, tuple[Callable[[Doc], None], Callable[[Doc], None], str]] = {
    "": (
        _set(lambda d: d["metadata"], "name", "a" * 63),
        _set(lambda d: d["metadata"], "name", "a" * 80),  # the name too long for a DNS label
        "DNS-1123",
    ),
    ".spec.roles[]": (
        lambda d: role(d).update(replicas=4, minReplicas=2, maxReplicas=8),
        lambda d: role(d).update(replicas=4, minReplicas=5),
        "minReplicas",
    ),
    ".spec.roles[].env": (
        _set(role, "env", {"HF_HOME": "/cache"}),
        _set(role, "env", {"1BAD": "x"}),
        "environment variable",
    ),
    ".spec.roles[].template.metadata.labels": (
        _meta("labels", {"team": "llm"}),
        _meta("labels", {"stalwart.dev/job": "other"}),
        "labels",
    ),
    ".spec.roles[].template.metadata.annotations": (
        _meta("annotations", {"example.com/owner": "llm"}),
        _meta("annotations", {"stalwart.dev/node": "x"}),
        "annotations",
    ),
    ".spec.roles[].template.spec.volumes": (_volume("data"), _volume("dshm"), "volumes"),
    ".spec.roles[].template.spec.containers[].env": (
        _env("AWS_REGION"),
        _env("STALWART_ETCD"),
        "environment variables",
    ),
    ".spec.faultTolerance": (
        _set(lambda d: d["spec"]["faultTolerance"], "leaseTtlSeconds", 2),
        _set(lambda d: d["spec"]["faultTolerance"], "leaseTtlSeconds", 1),
        "twice",
    ),
}
# Transition rules: (the old document's change, the new one's that is refused, a word of the message);
# the unchanged document is the accepted one.
TRANSITIONS: dict[str, tuple[Callable[[Doc], None], Callable[[Doc], None], str]] = {
    ".spec": (lambda d: None, _set(role, "replicas", 3), "roles cannot change"),
    ".spec.managedBy": (
        _set(lambda d: d["spec"], "managedBy", "stalwart.dev/operator"),
        _set(lambda d: d["spec"], "managedBy", "kueue.x-k8s.io/multikueue"),
        "managedBy",
    ),
}


def test_every_rule_has_a_case() -> None:
    found = {(path, "oldSelf" in rule["rule"]) for path, rule in rules_at(schema())}
    assert found == {(p, False) for p in CASES} | {(p, True) for p in TRANSITIONS}


@pytest.mark.parametrize("path", sorted(CASES), ids=lambda p: p or "(root)")
def test_a_rule_accepts_the_good_and_refuses_the_bad(path: str) -> None:
    good_change, bad_change, word = CASES[path]
    good, bad = example(), example()
    good_change(good)
    bad_change(bad)
    assert refusals(good) == []
    messages = refusals(bad)
    assert len(messages) == 1 and word in messages[0], messages


@pytest.mark.parametrize("path", sorted(TRANSITIONS), ids=lambda p: p)
def test_a_transition_rule_allows_no_change_and_refuses_a_change(path: str) -> None:
    old_change, new_change, word = TRANSITIONS[path]
    old = example()
    old_change(old)
    same, changed = copy.deepcopy(old), copy.deepcopy(old)
    new_change(changed)
    assert refusals(same, old) == []
    messages = refusals(changed, old)
    assert len(messages) == 1 and word in messages[0], messages


def test_an_eighty_character_name_is_refused_by_the_crd_and_the_model() -> None:
    from stalwart.spec import SpecError, parse_job

    doc = example()
    doc["metadata"]["name"] = "a" * 80
    assert any("DNS-1123" in m for m in refusals(doc))
    with pytest.raises(SpecError, match="at most 63"):
        parse_job(doc)
