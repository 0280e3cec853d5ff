"""The node's shadow data loader: started by the agent, it outlives every restart of the workers."""

from __future__ import annotations

import glob
from pathlib import Path

from stalwart.dataloader import DataConfig, ShadowLoaderSupervisor, SourceSpec
from stalwart.spec import DataSettings

CONFIG_ENV = "STALWART_DATA_CONFIG"


def data_config(settings: DataSettings, job_dir: Path) -> DataConfig:
    """The loader's config from the job spec, with shard paths made absolute (relative to the job file)."""
    sources = []
    for src in settings.sources:
        patterns = [p if Path(p).is_absolute() else str(job_dir / p) for p in src.shards]
        if not any(glob.glob(p) for p in patterns):
            raise FileNotFoundError(
                f"data source {src.name!r}: no shard files match {src.shards} (relative to {job_dir}); "
                "build them with `stalwart data build OUT_DIR TEXT_FILES...`"
            )
        sources.append(SourceSpec(name=src.name, shards=patterns))
    return DataConfig(
        sources=sources,
        weights={s.name: s.weight for s in settings.sources},
        seq_len=settings.seq_len,
        seed=settings.seed,
    )


def start_shadow_loader(
    settings: DataSettings, job_dir: Path, job: str, node: str, lanes: int
) -> ShadowLoaderSupervisor:
    config = data_config(settings, job_dir)
    return ShadowLoaderSupervisor(config, job=job, node=node, lanes=lanes, max_micro_batch=settings.micro_batch).start()
