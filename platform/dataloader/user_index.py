"""Build (or rebuild) the one-time indexes of a config's hf and megatron sources: `stalwart data index`."""

from __future__ import annotations

from stalwart.dataloader.config import DataConfig


def build_indexes(config: DataConfig, *, rebuild: bool = False) -> dict[str, str]:
    """Source name -> where its index or checksum sidecars are, for every hf and megatron source."""
    built: dict[str, str] = {}
    for spec in config.sources:
        paths = spec.resolve()
        if spec.format == "hf":
            from stalwart.dataloader.hf_source import build_index

            built[spec.name] = str(build_index(spec, paths, rebuild=rebuild))
        elif spec.format == "megatron":
            from stalwart.dataloader.megatron_source import ensure_sidecar, sidecar_path

            for path in paths:
                ensure_sidecar(path, spec.index_dir, rebuild=rebuild)
            built[spec.name] = ", ".join(str(sidecar_path(p, spec.index_dir)) for p in paths)
    return built
