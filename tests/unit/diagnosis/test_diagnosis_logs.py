"""Log classification: crashes from real runs (and real recorded machine-fault lines), read with the
signature database; user code never blames a machine, a machine-specific signature names its machine."""

from __future__ import annotations

import pytest
from support.paths import REPO

from stalwart.diagnosis import EvidenceBundle, RankLog, Topology, diagnose
from stalwart.diagnosis.corpus import CorpusCase, load_corpus
from stalwart.diagnosis.log_classify import last_traceback, strip_rank_prefix
from stalwart.signatures import BlameScope, default_database

CORPUS = REPO / "tests" / "data" / "diagnosis" / "corpus"
CRASHES = sorted(c.name for c in load_corpus(CORPUS) if c.bundle.kind == "crash")
PEER_CLOSED = next(c for c in default_database().classes if c.name == "peer_closed").samples[0].line


@pytest.fixture(scope="module")
def cases() -> dict[str, CorpusCase]:
    return {c.name: c for c in load_corpus(CORPUS)}


def test_a_real_traceback_behind_torchs_rank_prefix(cases: dict[str, CorpusCase]) -> None:
    lines = cases["crash-user-exception-all"].bundle.logs[3].lines
    assert lines[-1].startswith("[rank3]: IndexError")  # as torch printed it
    tb = last_traceback(strip_rank_prefix(lines))
    assert tb is not None and tb.exc_type == "IndexError" and tb.message == "list index out of range"
    assert tb.frames[:2] == ("get_learning_rate (emulate_3d.py)", "train_step (emulate_3d.py)")  # innermost first


@pytest.mark.parametrize("name", CRASHES)
def test_crash_cases_get_their_class_and_blame(name: str, cases: dict[str, CorpusCase]) -> None:
    case = cases[name]
    v = diagnose(case.bundle)
    assert (v.failure_class, v.flagged) == (case.truth.failure_class, case.truth.faulty_nodes), v.summary
    assert v.blame == case.truth.blame or (case.truth.blame == "node" and v.blame == "node"), v.summary
    if case.truth.blame == "user_code":
        assert v.action == "fail" and not v.flagged  # never a machine
    if case.truth.failure_class == "nan_loss":
        assert v.action == "rollback" and v.blame == "job"
    if case.truth.faulty_nodes:
        assert v.action == "evict" and v.suspects[0].node == case.truth.faulty_nodes[0]
        assert v.suspects[0].reasons and v.evidence


def _bundle(per_rank: dict[int, tuple[int | None, list[str]]], nodes: int = 4, rpn: int = 2) -> EvidenceBundle:
    world = nodes * rpn
    topo = Topology(world_size=world, dp=world, rank_nodes={r: f"n{r // rpn}" for r in range(world)})
    logs = [RankLog(rank=r, exit_code=code, lines=lines) for r, (code, lines) in per_rank.items()]
    return EvidenceBundle(job="logs", kind="crash", topology=topo, logs=logs)


@pytest.mark.parametrize(
    "spec", [c for c in default_database().classes if c.scope is BlameScope.NODE], ids=lambda c: c.name
)
def test_a_machine_signature_on_one_rank_names_its_machine(spec: object) -> None:
    for sample in spec.samples:  # type: ignore[attr-defined]
        per_rank = {r: (1, [PEER_CLOSED]) for r in range(8)}
        per_rank[5] = (1, ["Traceback (most recent call last):", '  File "train.py", line 9, in step', sample.line])
        v = diagnose(_bundle(per_rank))
        assert v.failure_class == spec.name and v.flagged == ["n2"] and v.blame == "node", (sample.line, v.summary)  # type: ignore[attr-defined]


def test_the_same_cuda_error_everywhere_is_the_code_but_xid_is_always_the_machine() -> None:
    illegal = "RuntimeError: CUDA error: an illegal memory access was encountered"
    v = diagnose(_bundle({r: (1, [illegal]) for r in range(8)}))
    assert v.failure_class == "cuda_error" and v.blame == "user_code" and not v.flagged
    xid = default_database().get("xid").samples[0].line
    v = diagnose(_bundle({r: (1, [xid]) for r in range(8)}))
    assert v.failure_class == "xid" and len(v.flagged) == 4  # hardware, on every machine it shows on


def test_the_same_exception_on_every_rank_blames_no_machine() -> None:
    tb = [
        "Traceback (most recent call last):",
        '  File "/job/train.py", line 3, in <module>',
        '  File "/job/model.py", line 40, in forward',
        "ValueError: expected 64 channels, got 32",
    ]
    v = diagnose(_bundle(dict.fromkeys(range(8), (1, tb))))
    assert (v.failure_class, v.blame, v.flagged, v.action) == ("user_code_error", "user_code", [], "fail")
    assert "ValueError" in v.summary and v.suspects == []


def test_only_symptoms_blame_the_job_and_a_silent_death_its_machine() -> None:
    v = diagnose(_bundle({r: (1, [PEER_CLOSED]) for r in range(8)}))
    assert v.failure_class == "peer_closed" and v.blame == "job" and not v.flagged
    per_rank: dict[int, tuple[int | None, list[str]]] = {r: (1, [PEER_CLOSED]) for r in range(8)}
    per_rank[6] = (-9, [])
    v = diagnose(_bundle(per_rank))
    assert v.flagged == ["n3"] and "SIGKILL" in v.summary
