"""`stalwart data ...`: build and verify token shards."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from stalwart.cli.errors import print_error
from stalwart.cli.output import out

app = typer.Typer(help="Build and verify token shards for the data loader.", no_args_is_help=True)


@app.command()
def build(
    out_dir: Annotated[Path, typer.Argument(help="Folder for the shards.")],
    files: Annotated[list[Path], typer.Argument(help="Text files to tokenize (byte-level).")],
    prefix: Annotated[str, typer.Option(help="Shard names: PREFIX-00000.stok, ... (one source per prefix).")] = "shard",
    shard_tokens: Annotated[int, typer.Option(help="Tokens per shard.")] = 1 << 24,
    overwrite: Annotated[bool, typer.Option(help="Replace existing shards of that prefix.")] = False,
) -> None:
    """Tokenize text files into checksummed, memory-mappable shards.

    Example: stalwart data build examples/data/shards examples/data/stories.txt --prefix stories
    """
    from stalwart.dataloader import DataError, build_shards

    missing = [str(f) for f in files if not f.is_file()]
    if missing:
        print_error(f"no such file: {', '.join(missing)}")
        raise typer.Exit(2)
    try:
        paths = build_shards(files, out_dir, prefix=prefix, shard_tokens=shard_tokens, overwrite=overwrite)
    except (DataError, ValueError, FileExistsError) as exc:
        print_error(str(exc))
        raise typer.Exit(1) from None
    out.print(f"built {len(paths)} shard(s) in {out_dir}: {', '.join(p.name for p in paths)}", highlight=False)


@app.command()
def verify(files: Annotated[list[Path], typer.Argument(help="Shard files to check.")]) -> None:
    """Check shards' headers and checksums; names every bad file.

    Example: stalwart data verify examples/data/shards/*.stok
    """
    from stalwart.dataloader import DataError, verify_shards

    try:
        verify_shards(files)
    except DataError as exc:
        print_error(str(exc))
        raise typer.Exit(1) from None
    out.print(f"{len(files)} shard(s) OK")


@app.command()
def index(
    config_file: Annotated[Path, typer.Argument(help="A data config as JSON (the loader's DataConfig).")],
    rebuild: Annotated[bool, typer.Option(help="Rebuild indexes and checksum sidecars that exist.")] = False,
) -> None:
    """Build the one-time index of each hf and megatron source, then open every source as a job would.

    hf sources are tokenized into checksummed shards; megatron sources get their checksum sidecar.
    Without this, the first open builds them. Example: stalwart data index data.json
    """
    from stalwart.dataloader import DataConfig, DataError, TokenDataset
    from stalwart.dataloader.user_index import build_indexes

    try:
        config = DataConfig.loads(config_file.read_bytes())
    except (OSError, ValueError) as exc:
        print_error(f"{config_file}: not a readable data config: {exc}")
        raise typer.Exit(2) from None
    try:
        built = build_indexes(config, rebuild=rebuild)
        dataset = TokenDataset(config)
    except DataError as exc:
        print_error(str(exc))
        raise typer.Exit(1) from None
    try:
        for spec, source in zip(config.sources, dataset.sources, strict=True):
            where = f" (index: {built[spec.name]})" if spec.name in built else ""
            out.print(f"{spec.name}: {spec.format}, {source.num_samples} samples per epoch{where}", highlight=False)
    finally:
        dataset.close()
