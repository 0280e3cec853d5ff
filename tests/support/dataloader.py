"""Helpers for the data-loader tests: the fixture corpus as shards, a shadow loader, and trainer
processes to run, kill and restart. A pytest plugin (the root conftest loads it): `data_config`,
`supervisor` and `trainers` are fixtures every test can ask for."""

from __future__ import annotations

import json
import os
import signal
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from stalwart.dataloader import DataConfig, Milestone, ShadowLoaderSupervisor, SourceSpec, build_shards
from stalwart.dataloader.shm_layout import shm_dir
from stalwart.processes import stop_process, wait_for
from support.paths import REPO
from support.ranks import RankProcess, shared_host

CORPUS = REPO / "tests" / "data" / "dataloader" / "corpus"
TRAINER = REPO / "tests" / "data" / "dataloader" / "trainer.py"
SOURCES = ("prose", "code", "numbers")
SEQ_LEN = 32
SWITCH_AT = 400  # a curriculum milestone: the mixture changes at this global sample


def build_corpus(root: Path, *, seed: int = 11, schedule: bool = True, block_tokens: int = 1024) -> DataConfig:
    """Shards for the three fixture texts (one document per line) and a mixture with a milestone."""
    for name in SOURCES:
        if not (root / name).exists():
            build_shards(
                [CORPUS / f"{name}.txt"], root / name, shard_tokens=4096, doc_per="line", block_tokens=block_tokens
            )
    milestones = [Milestone(at_sample=SWITCH_AT, weights={"prose": 0.2, "code": 0.3, "numbers": 0.5})]
    return DataConfig(
        sources=[SourceSpec(name=n, shards=[str(root / n / "*.stok")]) for n in SOURCES],
        weights={"prose": 0.5, "code": 0.3, "numbers": 0.2},
        schedule=milestones if schedule else [],
        seq_len=SEQ_LEN,
        seed=seed,
    )


def _lines(name: str) -> list[str]:
    return [line for line in (CORPUS / f"{name}.txt").read_text().splitlines() if line.strip()]


def _mixture(sources: list[SourceSpec], *, seed: int, schedule: bool) -> DataConfig:
    milestones = [Milestone(at_sample=SWITCH_AT, weights={"prose": 0.2, "code": 0.3, "numbers": 0.5})]
    return DataConfig(
        sources=sources,
        weights={"prose": 0.5, "code": 0.3, "numbers": 0.2},
        schedule=milestones if schedule else [],
        seq_len=SEQ_LEN,
        seed=seed,
    )


def train_tokenizer(path: Path) -> Path:
    """A small BPE tokenizer trained on the fixture texts with the tokenizers trainer (nothing downloaded)."""
    if not path.exists():
        from tokenizers import Tokenizer, models, pre_tokenizers, trainers

        tok = Tokenizer(models.BPE(unk_token="<unk>"))
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        trainer = trainers.BpeTrainer(
            vocab_size=400, special_tokens=["<unk>", "<eos>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
        )
        tok.train_from_iterator([line for name in SOURCES for line in _lines(name)], trainer=trainer)
        path.parent.mkdir(parents=True, exist_ok=True)
        tok.save(str(path))
    return path


def build_hf_corpus(root: Path, *, seed: int = 11, schedule: bool = True) -> DataConfig:
    """The fixture texts as Hugging Face files (prose: parquet, code: jsonl, numbers: arrow), one document
    per line, tokenized with a locally trained BPE tokenizer: the same mixture as build_corpus."""
    import datasets

    tokenizer = train_tokenizer(root / "tokenizer.json")
    files = {"prose": root / "prose.parquet", "code": root / "code.jsonl", "numbers": root / "numbers.arrow"}
    for name, path in files.items():
        if path.exists():
            continue
        ds = datasets.Dataset.from_dict({"text": _lines(name), "doc": list(range(len(_lines(name))))})
        if path.suffix == ".parquet":
            ds.to_parquet(str(path))
        elif path.suffix == ".jsonl":
            ds.to_json(str(path), lines=True)
        else:
            ds.save_to_disk(str(root / "numbers-ds"))
            (arrow,) = (root / "numbers-ds").glob("*.arrow")
            arrow.rename(path)
    specs = [
        SourceSpec(name=n, shards=[str(p)], format="hf", tokenizer=str(tokenizer), eos_token="<eos>")
        for n, p in files.items()
    ]
    return _mixture(specs, seed=seed, schedule=schedule)


def write_megatron(prefix: Path, documents: Sequence[str]) -> Path:
    """A Megatron indexed dataset (prefix.bin/.idx) written by megatron-core's own builder (byte tokens)."""
    import numpy as np
    import torch
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    from stalwart.dataloader import ByteTokenizer

    tok = ByteTokenizer()
    builder = IndexedDatasetBuilder(str(prefix.with_suffix(".bin")), dtype=np.uint16)
    for doc in documents:
        ids = np.concatenate([tok.encode(doc), [tok.eos_id]]).astype(np.int64)
        builder.add_document(torch.from_numpy(ids), [len(ids)])
    builder.finalize(str(prefix.with_suffix(".idx")))
    return prefix.with_suffix(".bin")


def build_megatron_corpus(root: Path, *, seed: int = 11, schedule: bool = True) -> DataConfig:
    """The fixture texts as Megatron indexed datasets: the same mixture as build_corpus."""
    root.mkdir(parents=True, exist_ok=True)
    specs = []
    for name in SOURCES:
        path = root / f"{name}.bin"
        if not path.exists():
            write_megatron(root / name, _lines(name))
        specs.append(SourceSpec(name=name, shards=[str(path)], format="megatron"))
    return _mixture(specs, seed=seed, schedule=schedule)


@pytest.fixture(scope="module")
def data_config(tmp_path_factory: pytest.TempPathFactory) -> DataConfig:
    return build_corpus(tmp_path_factory.mktemp("shards"))


@pytest.fixture
def supervisor(data_config: DataConfig) -> Iterator[ShadowLoaderSupervisor]:
    """A started shadow loader (its process and segment) for a 2-lane node; closed after the test."""
    sup = ShadowLoaderSupervisor(
        data_config, job=f"test-{uuid.uuid4().hex[:8]}", node="node-0", lanes=2, max_micro_batch=8, slots=4
    )
    sup.start()
    try:
        yield sup
    finally:
        sup.close()
    assert not sup_path(sup).exists(), "the segment must be removed on close"


def sup_path(sup: ShadowLoaderSupervisor) -> Path:
    return shm_dir() / sup.name


# ------------------------------------------------------------------------------------- trainers
class Trainers:
    """One incarnation of a data-parallel job: `world` trainer processes joined by gloo, forked by
    this test process's rank host (support.ranks) as an agent forks its workers: torch's import is
    paid once per pytest worker, not once per trainer (about 2 CPU-seconds each)."""

    def __init__(
        self,
        run_dir: Path,
        config: DataConfig,
        *,
        world: int,
        micro_batch: int,
        steps: int,
        ckpt_every: int = 5,
        shm: str | None = None,
        extra: Sequence[str] = (),
    ) -> None:
        run_dir.mkdir(parents=True, exist_ok=True)
        config_path = run_dir / "data.json"
        config_path.write_text(config.dumps())
        self.run_dir = run_dir
        args = [
            "--config",
            str(config_path),
            "--run-dir",
            str(run_dir),
            "--steps",
            str(steps),
            "--ckpt-every",
            str(ckpt_every),
            "--micro-batch",
            str(micro_batch),
            *(["--shm", shm] if shm else []),
            *extra,
        ]
        self.procs: list[RankProcess] = shared_host().start(TRAINER, args, world, cwd=run_dir)

    def logs(self) -> str:
        return "\n".join(p.read_text(errors="replace")[-3000:] for p in sorted(self.run_dir.glob("rank*.log")))

    def wait_paused(self, step: int, timeout: float = 90.0) -> None:
        def paused() -> bool:
            assert all(p.poll() is None for p in self.procs), f"a trainer exited early:\n{self.logs()}"
            return all((self.run_dir / f"paused-{step}-rank{r}").exists() for r in range(len(self.procs)))

        assert wait_for(paused, timeout), f"trainers did not reach step {step}:\n{self.logs()}"

    def kill(self) -> None:
        """SIGKILL every rank, as a lost machine or an OOM kill would."""
        for p in self.procs:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for p in self.procs:
            p.wait(timeout=30)

    def wait(self, timeout: float = 120.0) -> list[int]:
        try:
            codes = [p.wait(timeout=timeout) for p in self.procs]
        finally:
            self.stop()
        return codes

    def stop(self) -> None:
        for p in self.procs:
            stop_process(p, grace=2.0)


@pytest.fixture
def trainers() -> Iterator[list[Trainers]]:
    """Register each incarnation here; whatever is still running at the end is stopped."""
    started: list[Trainers] = []
    yield started
    for t in started:
        t.stop()


def committed_steps(run_dir: Path) -> dict[int, list[int]]:
    """step -> global sample ids, from the checkpoints: what the job's committed steps trained on."""
    out: dict[int, list[int]] = {}
    for path in sorted((run_dir / "ckpt").glob("ckpt-*.json")):
        for step, ids in json.loads(path.read_text())["window"].items():
            out[int(step)] = ids
    return out


def journal(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "journal.jsonl").read_text().splitlines()]
