"""Hostile job files: amplified, oversized, deep, recursive, escaping their folder, setting the
platform's variables. Each is refused before it costs anything, with a short message that names the
field and the problem and never quotes more than a few dozen characters of what was sent."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path
from typing import Any

import pytest
from support.cli_invoke import Cli

from stalwart.spec import ALLOWED_PATHS_ENV, PathConfinement, SpecError, confined, load_job, parse_job
from stalwart.spec.loader import MAX_DOCUMENT_BYTES, MAX_SPEC_BYTES, parse_yaml

JOB = """\
apiVersion: stalwart.dev/v1alpha1
kind: TrainingJob
metadata: {name: probe}
spec:
  roles:
    - name: trainer
      command: [python, train.py]
"""
SHORT = 600  # no refusal below needs more characters than this


def write(tmp_path: Path, text: str, name: str = "job.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def refusal(path: Path) -> str:
    """The message, which names the file and stays short (paths it names aside)."""
    with pytest.raises(SpecError) as info:
        load_job(path)
    message = str(info.value)
    assert str(path) in message and len(message) < SHORT + 4 * len(str(path)), message
    return message


def test_one_string_aliased_256_times_is_refused_before_it_is_built(tmp_path: Path) -> None:
    # 700 KB written once, named 256 times: 180 MB as JSON (the probe's 4 MiB version was 1 GB).
    text = "x-blob: &blob " + "y" * 700_000 + "\nx-copies: [" + ", ".join(["*blob"] * 256) + "]\n" + JOB
    assert len(text) < MAX_SPEC_BYTES
    assert "once its aliases are expanded" in refusal(write(tmp_path, text))


def test_billion_laughs_and_merge_key_laughs_are_refused(tmp_path: Path) -> None:
    laughs = "l0: &l0 [lol]\n" + "".join(f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 10)}]\n" for i in range(1, 10))
    assert "aliases are expanded" in refusal(write(tmp_path, laughs + JOB, "laughs.yaml"))
    # `<<: [*m, *m]` copies the merged pairs: 2^40 of them, unless the merge is counted first.
    merges = "m0: &m0 {k: v}\n" + "".join(f"m{i}: &m{i} {{<<: [*m{i - 1}, *m{i - 1}]}}\n" for i in range(1, 40))
    assert "aliases are expanded" in refusal(write(tmp_path, merges + JOB, "merges.yaml"))


def test_deep_and_recursive_documents_are_refused(tmp_path: Path) -> None:
    # libyaml's composer recurses in C: 200,000 open brackets would crash the process.
    assert "nested more than 32 levels" in refusal(write(tmp_path, "[" * 200_000 + "]" * 200_000, "deep.yaml"))
    assert "refers to a node that contains it" in refusal(write(tmp_path, "a: &a [1, *a]\n" + JOB, "loop.yaml"))
    assert "no anchor" in refusal(write(tmp_path, "a: *nowhere\n" + JOB, "undefined.yaml"))


def test_a_large_file_is_refused_unread(tmp_path: Path) -> None:
    big = tmp_path / "big.yaml"
    with open(big, "wb") as f:
        f.write(JOB.encode())
        f.truncate(50 * 1024 * 1024)  # 50 MB (sparse): refused on its size
    assert "50 MiB" not in refusal(big) and "52,428,800 bytes" in refusal(big)
    assert "larger than 1 MiB" in refusal(Path("/dev/zero"))  # endless: read up to the limit, no further


def test_values_are_never_echoed_whole(tmp_path: Path) -> None:
    huge = "Z" * 400_000
    for edit in (
        ("metadata: {name: probe}", f"metadata: {{name: {huge}}}"),
        ("kind: TrainingJob", f"kind: {huge}"),
        ("      command: [python, train.py]", f"      command: [python, train.py]\n      restartScope: {huge}"),
        (
            "      command: [python, train.py]",
            f"      command: [python, train.py]\n      env:\n        ? {huge}\n        : v",
        ),
        ("      command: [python, train.py]", f"      command: [python, train.py]\n      ? {huge}\n      : v"),
        ("  roles:", f"  checkpoint: {{intervalSteps: {'9' * 5000}}}\n  roles:"),
        ("  roles:", f"  checkpoint: {{uri: '{huge}://x'}}\n  roles:"),
        ("      command: [python, train.py]", f"      command: [python, train.py]\n      env: {{V: {huge}}}"),
        ("[python, train.py]", f"[python, {huge}]"),
    ):
        message = refusal(write(tmp_path, JOB.replace(*edit)))
        assert "ZZZZZZZZZZ" not in message or "(400,000 characters)" in message


def test_a_custom_resource_body_is_bounded_the_same_way() -> None:
    doc: dict[str, Any] = {
        "apiVersion": "stalwart.dev/v1alpha1",
        "kind": "TrainingJob",
        "metadata": {"name": "probe"},
        "spec": {"roles": [{"name": "trainer", "command": ["python", "t.py"]}]},
    }
    blob = "b" * 100_000
    shared = [blob] * 20  # one object referenced 20 times: 2 MB as JSON
    with pytest.raises(SpecError, match="larger than 1 MiB as JSON"):
        parse_job({**doc, "spec": {**doc["spec"], "x": shared}})
    nested: Any = "leaf"
    for _ in range(100):
        nested = [nested]
    with pytest.raises(SpecError, match="nested more than 32 levels"):
        parse_job({**doc, "spec": {**doc["spec"], "x": nested}})
    cyclic: list[Any] = []
    cyclic.append(cyclic)
    with pytest.raises(SpecError, match="nested more than|larger than"):
        parse_job({**doc, "spec": {**doc["spec"], "x": cyclic}})
    with pytest.raises(SpecError) as info:
        parse_job({**doc, "spec": {**doc["spec"], "k" * 300_000: 1}})
    assert len(str(info.value)) < SHORT and "(300,000 characters)" in str(info.value)
    assert parse_job(doc).name == "probe"
    assert MAX_DOCUMENT_BYTES == 1024 * 1024


def test_the_platforms_and_the_loaders_variables_are_refused_by_name(tmp_path: Path) -> None:
    env = "{LD_PRELOAD: /x.so, RANK: '3', STALWART_CHECKPOINT_TOKEN: t, TORCHELASTIC_RUN_ID: r, MASTER_ADDR: h}"
    message = refusal(write(tmp_path, JOB + f"      env: {env}\n"))
    for name in ("LD_PRELOAD", "RANK", "STALWART_CHECKPOINT_TOKEN", "TORCHELASTIC_RUN_ID", "MASTER_ADDR"):
        assert name in message
    assert "spec.roles[0].env" in message
    for name in ("LD_LIBRARY_PATH", "LD_AUDIT", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT", "STALWART_JOB"):
        assert name in refusal(write(tmp_path, JOB + f"      env: {{{name}: x}}\n"))
    ok = load_job(
        write(tmp_path, JOB + "      env: {PYTHONPATH: src, NCCL_DEBUG: INFO, rank: lower-case is not RANK}\n")
    )
    assert ok.spec.roles[0].env["PYTHONPATH"] == "src"


def test_working_dir_and_checkpoint_paths_stay_in_the_jobs_folder(tmp_path: Path) -> None:
    jobs = tmp_path / "jobs"
    (jobs / "code").mkdir(parents=True)
    (jobs / "escape").symlink_to("/etc")
    for working_dir in ("../../../../etc", "/etc", "escape", "code/../../jobs-other"):
        message = refusal(write(jobs, JOB + f"      workingDir: {working_dir}\n"))
        assert "spec.roles[0].workingDir" in message and "not inside the job's folder" in message
        assert ALLOWED_PATHS_ENV in message
    for uri in ("../../x", "file:///etc/ckpt", "/tmp", ".", "escape/ckpt"):
        message = refusal(write(jobs, JOB + f"  checkpoint: {{uri: '{uri}'}}\n"))
        assert "spec.checkpoint.uri" in message
    job = load_job(write(jobs, JOB + "      workingDir: code\n  checkpoint: {uri: ckpt}\n"))
    paths = PathConfinement.from_env(jobs, {})
    assert paths.working_dir(job.spec.roles[0]) == (jobs / "code").resolve()
    assert paths.checkpoint_uri(job.spec.checkpoint.uri) == str((jobs / "ckpt").resolve())
    for uri in ("s3://bucket/run?endpoint=http://127.0.0.1:9", "mem://127.0.0.1:1/job"):
        assert paths.checkpoint_uri(uri) == uri  # other tiers pass through as they are
    assert "unsupported URI scheme 'http'" in refusal(write(jobs, JOB + "  checkpoint: {uri: 'http://x/y'}\n"))


def test_an_allowed_folder_is_allowed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    path = write(jobs, JOB + f"      workingDir: {shared}\n  checkpoint: {{uri: 'file://{shared}/ckpt'}}\n")
    refusal(path)
    monkeypatch.setenv(ALLOWED_PATHS_ENV, f"relative/ignored{os.pathsep}{shared}")
    job = load_job(path)
    assert job.spec.roles[0].working_dir == str(shared)
    with pytest.raises(SpecError, match="a folder inside"):  # the allowed folder itself: a replay writes beside it
        confined(
            job.model_copy(
                update={
                    "spec": job.spec.model_copy(
                        update={"checkpoint": job.spec.checkpoint.model_copy(update={"uri": str(shared)})}
                    )
                }
            ),
            PathConfinement.from_env(jobs),
        )


def test_the_cli_refuses_an_amplified_job_quickly_and_briefly(tmp_path: Path, cli: Cli) -> None:
    text = "x-blob: &blob " + "y" * 700_000 + "\nx-copies: [" + ", ".join(["*blob"] * 256) + "]\n" + JOB
    out = cli("run", str(write(tmp_path, text)))
    assert out.returncode == 2 and "aliases are expanded" in out.stderr
    assert len(out.stderr) < 1000 and "Traceback" not in out.stderr and not out.stdout
    assert not (tmp_path / ".stalwart").exists()


def test_parse_yaml_of_the_examples_is_unchanged() -> None:
    text = textwrap.dedent(JOB)
    assert parse_yaml(text)["metadata"] == {"name": "probe"}
