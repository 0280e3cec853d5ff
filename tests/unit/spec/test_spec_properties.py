"""Property tests of the spec loader (hypothesis, bounded: a few hundred small examples in all).

Whatever arrives, as YAML text or as a parsed document, the loader answers a TrainingJob or a
SpecError, never another exception, and its message stays short whatever the input's size; a valid
job survives the trip through YAML; the env validator refuses exactly what the reserved-name rule
says; a working directory is accepted exactly when it stays inside the job's folder."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stalwart.spec import PathConfinement, Role, SpecError, TrainingJob, parse_job
from stalwart.spec.confinement import ConfinementError
from stalwart.spec.env_names import refusal
from stalwart.spec.loader import parse_yaml

BOUNDED = settings(max_examples=40, deadline=None, derandomize=True, database=None)
MESSAGE_LIMIT = 3000  # 20 problems of ~120 characters, whatever the size of what was sent

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=False),
    st.text(max_size=30),
    st.text(min_size=1, max_size=8).map(lambda s: s * 5000),  # large values, cheaply
)
documents = st.recursive(
    scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4)
)
names = st.from_regex(r"\A[a-z]([a-z0-9-]{0,10}[a-z0-9])?\Z")
env_names = st.from_regex(r"\A[A-Za-z_][A-Za-z0-9_]{0,20}\Z") | st.sampled_from(
    ["RANK", "LD_PRELOAD", "STALWART_X", "TORCHELASTIC_Y", "MASTER_PORT", "PYTHONPATH", "LD_", "NCCL_DEBUG"]
)


def base(**spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "stalwart.dev/v1alpha1",
        "kind": "TrainingJob",
        "metadata": {"name": "prop"},
        "spec": {"roles": [{"name": "trainer", "command": ["python", "t.py"]}], **spec},
    }


@BOUNDED
@given(documents)
def test_any_document_is_a_job_or_a_short_spec_error(document: Any) -> None:
    for candidate in (document, base(extra=document), base(faultTolerance=document), base(roles=document)):
        try:
            assert isinstance(parse_job(candidate), TrainingJob)
        except SpecError as exc:
            assert len(str(exc)) < MESSAGE_LIMIT


@settings(BOUNDED, suppress_health_check=[HealthCheck.too_slow])
@given(st.text(max_size=400) | st.text(alphabet="[]{}:,&*!|>-'\"#? \n\tab01", max_size=400))
def test_any_text_parses_or_is_refused_briefly(text: str) -> None:
    try:
        parse_yaml(text)
    except SpecError as exc:
        assert len(str(exc)) < MESSAGE_LIMIT


@BOUNDED
@given(
    st.lists(names, min_size=1, max_size=3, unique=True),
    st.dictionaries(
        st.from_regex(r"\A[A-Z][A-Z0-9_]{0,10}\Z").filter(lambda n: refusal(n) is None), st.text(max_size=20)
    ),
    st.integers(1, 64),
)
def test_a_valid_job_survives_the_trip_through_yaml(roles: list[str], env: dict[str, str], procs: int) -> None:
    doc = base()
    doc["spec"]["roles"] = [
        {"name": n, "processesPerNode": procs, "command": ["python", f"{n}.py"], "env": env} for n in roles
    ]
    job = parse_job(doc)
    again = parse_job(parse_yaml(yaml.safe_dump(job.model_dump(mode="json", by_alias=True))))
    assert again == job


@BOUNDED
@given(st.dictionaries(env_names, st.text(max_size=10), min_size=1, max_size=4))
def test_env_names_are_refused_exactly_when_reserved(env: dict[str, str]) -> None:
    refused = sorted(n for n in env if refusal(n) is not None)
    try:
        Role(name="r", command=["x"], env=env)
        assert not refused
    except ValueError as exc:
        assert refused and all(n in str(exc) for n in refused[:5])


segments = st.lists(st.sampled_from(["..", ".", "a", "b", "c", ""]), min_size=1, max_size=6)


@BOUNDED
@given(segments)
def test_a_working_dir_is_accepted_exactly_when_it_stays_inside(parts: list[str]) -> None:
    job_dir = Path("/srv/jobs/one")  # lexical: nothing here exists, so no link can lead out
    relative = "/".join(parts) or "."
    inside = os.path.normpath(job_dir / relative)
    expected = inside == str(job_dir) or inside.startswith(str(job_dir) + "/")
    role = Role(name="r", command=["x"], working_dir=relative)
    try:
        got = PathConfinement(job_dir).working_dir(role)
        assert expected and str(got) == inside
    except ConfinementError as exc:
        assert not expected and "workingDir" in str(exc)
