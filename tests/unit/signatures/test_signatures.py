"""The signature database: its samples, exit codes, the streaming scanner and the exit verdict."""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

import pytest
import yaml

from stalwart.signatures import (
    BlameScope,
    LogScanner,
    classify_exit,
    default_database,
    load_signatures,
)
from stalwart.signatures.loader import SignatureFileError, parse_signatures
from stalwart.signatures.scanner import signal_of

REQUIRED_CLASSES = {
    "cuda_error",
    "nccl_error",
    "nccl_timeout",
    "ecc_error",
    "xid",
    "gpu_oom",
    "cpu_oom",
    "segfault",
    "bus_error",
    "python_exception",
    "nan_loss",
    "loss_spike",
    "disk_full",
    "peer_closed",
}


def test_the_packaged_file_loads_and_has_every_class() -> None:
    db = default_database()
    assert {c.name for c in db.classes} >= REQUIRED_CLASSES
    assert files("stalwart.signatures").joinpath("signatures.yaml").is_file()  # package data, not a repo path


def test_every_class_has_samples_and_each_sample_yields_its_class_and_scope() -> None:
    db = default_database()
    for spec in db.classes:
        assert spec.samples, spec.name
        for sample in spec.samples:
            scanner = LogScanner(db, rank=5)
            [match] = scanner.feed(sample.line + "\n")
            assert (match.failure_class, match.scope, match.severity) == (spec.name, spec.scope, spec.severity), (
                sample.line
            )
            assert match.rank == 5 and match.line_number == 1


def test_every_class_with_exit_codes_is_the_verdict_for_them() -> None:
    db = default_database()
    with_codes = [c for c in db.classes if c.exit_codes]
    assert {c.name for c in with_codes} >= {"cpu_oom", "segfault", "bus_error"}
    for spec in with_codes:
        for code in spec.exit_codes:
            tail = [spec.samples[0].line] if spec.exit_codes_need_evidence else []
            verdict = classify_exit(code, tail, database=db)
            assert (verdict.failure_class, verdict.scope) == (spec.name, spec.scope), (spec.name, code)
            if spec.exit_codes_need_evidence:
                assert classify_exit(code, ["nothing to see"], database=db).failure_class != spec.name


def test_blame_scopes() -> None:
    db = default_database()
    scope = {c.name: c.scope for c in db.classes}
    assert {scope[n] for n in ("xid", "ecc_error", "disk_full")} == {BlameScope.NODE}
    assert scope["peer_closed"] is BlameScope.JOB  # a symptom of another rank's failure
    assert scope["python_exception"] is BlameScope.USER_CODE


def test_sigkill_is_an_oom_only_when_the_kernel_says_so_about_this_process() -> None:
    oom = ["[  518.050606] Out of memory: Killed process 15784 (python3) total-vm:11964kB, anon-rss:4288kB"]
    assert classify_exit(-9, [], kernel_log=oom, pid=15784).failure_class == "cpu_oom"
    assert classify_exit(137, [], kernel_log=oom, pid=15784).signal == "SIGKILL"
    other = classify_exit(-9, [], kernel_log=oom, pid=999)
    assert other.failure_class is None and other.signal == "SIGKILL" and "SIGKILL" in other.reason


def test_root_causes_outrank_their_symptoms() -> None:
    tail = [
        "Traceback (most recent call last):",
        "RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed "
        "by peer [127.0.0.1]:16000.",
        "RuntimeError: CUDA error: uncorrectable ECC error encountered",
        "torch.distributed.DistBackendError: NCCL error in: x.cpp:1, unhandled cuda error",
    ]
    verdict = classify_exit(1, tail)
    assert (verdict.failure_class, verdict.scope) == ("ecc_error", BlameScope.NODE)
    assert verdict.evidence[0].line_number == 3
    assert classify_exit(1, tail[:2]).failure_class == "peer_closed"
    assert classify_exit(1, tail[:1]).failure_class == "python_exception"
    assert classify_exit(0, tail).failure_class is None


def test_the_scanner_streams_partial_lines_with_line_numbers() -> None:
    scanner = LogScanner(rank=2)
    assert scanner.feed("step 1 ok\nTraceback (most rec") == []
    [m] = scanner.feed('ent call last):\n  File "train.py", line 3\nFloatingPointError: loss is na')
    assert (m.failure_class, m.line_number) == ("python_exception", 2)
    [nan] = scanner.feed("n\n")
    assert (nan.failure_class, nan.line_number, nan.scope) == ("nan_loss", 4, BlameScope.JOB)
    assert scanner.feed("no newline yet: No space left on device") == []
    [full] = scanner.flush()
    assert full.failure_class == "disk_full" and full.line_number == 5


def test_a_very_long_line_is_bounded() -> None:
    scanner = LogScanner()
    assert scanner.feed("x" * 100_000) == []
    [m] = scanner.feed("\nRuntimeError: CUDA error: an illegal memory access was encountered\n")
    assert m.failure_class == "cuda_error" and len(m.line) <= 500


def test_signals_from_exit_codes() -> None:
    assert [signal_of(c).name for c in (-9, 137, -11, 139, -7, 135)] == [  # type: ignore[union-attr]
        "SIGKILL",
        "SIGKILL",
        "SIGSEGV",
        "SIGSEGV",
        "SIGBUS",
        "SIGBUS",
    ]
    assert signal_of(1) is None and signal_of(None) is None


def _doc() -> dict:  # type: ignore[type-arg]
    return yaml.safe_load(files("stalwart.signatures").joinpath("signatures.yaml").read_text(encoding="utf-8"))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d["classes"][0].update(patterns=["(unclosed"]), "not a valid regular expression"),
        (lambda d: d["classes"].append(dict(d["classes"][0])), "defined twice"),
        (lambda d: d["classes"][0].update(samples=[]), "samples"),
        (lambda d: d["classes"][0].update(scope="rack"), "scope"),
    ],
)
def test_a_bad_file_is_rejected_on_load(change, message: str) -> None:  # type: ignore[no-untyped-def]
    doc = _doc()
    change(doc)
    with pytest.raises(SignatureFileError, match=message):
        parse_signatures(yaml.safe_dump(doc))


def test_another_file_can_be_loaded(tmp_path: Path) -> None:
    path = tmp_path / "extra.yaml"
    doc = _doc()
    doc["classes"] = [c for c in doc["classes"] if c["name"] == "disk_full"]
    path.write_text(yaml.safe_dump(doc))
    db = load_signatures(path)
    assert [c.name for c in db.classes] == ["disk_full"]
    with pytest.raises(SignatureFileError, match="not valid YAML"):
        parse_signatures("classes: [unclosed")


def test_lines_prefixed_by_torch_distributed_excepthook_are_classified() -> None:
    """torch >= 2.3 prints an uncaught exception as '[rank3]: Traceback ...' once a process group
    exists (recorded from examples/pretrain_tiny.py --raise-at-step under gloo)."""
    from stalwart.signatures import classify_exit

    tail = [
        "[rank3]: Traceback (most recent call last):",
        '[rank3]:   File "/work/main/examples/pretrain_tiny.py", line 181, in <module>',
        '[rank3]:     raise ValueError(f"shapes do not match in my_custom_layer at step {step}")',
        "[rank3]: ValueError: shapes do not match in my_custom_layer at step 15 (a bug in the training code)",
    ]
    verdict = classify_exit(1, tail)
    assert verdict.failure_class == "python_exception" and verdict.scope.value == "user_code"
