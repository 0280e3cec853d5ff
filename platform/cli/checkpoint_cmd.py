"""`stalwart checkpoint ...`: list, inspect, export and import checkpoints."""

from __future__ import annotations

import json
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from stalwart.cli.errors import print_error
from stalwart.cli.output import out

app = typer.Typer(help="List, inspect, export and import checkpoints.", no_args_is_help=True)

URI_HELP = "A folder, file:///path, s3://bucket/prefix?endpoint=URL, or mem://host:port/ns?peer=host:port"


def _open(uri: str):  # type: ignore[no-untyped-def]
    from stalwart.checkpoint import open_storage

    try:
        return open_storage(uri)
    except ValueError as exc:
        print_error(str(exc))
        raise typer.Exit(2) from None


def _human(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return str(n)


@app.command("ls")
def list_checkpoints(
    uri: Annotated[str, typer.Argument(help=URI_HELP)],
    output: Annotated[str, typer.Option("--output", "-o", help="table or json")] = "table",
) -> None:
    """List committed checkpoints, oldest first.

    Example: stalwart checkpoint ls .stalwart/runs/pretrain-tiny-20261121-101500/checkpoints
    """
    from stalwart.checkpoint import Checkpointer, StorageError

    try:
        infos = Checkpointer(_open(uri)).catalog()
    except StorageError as exc:
        print_error(str(exc))
        raise typer.Exit(1) from None
    if output == "json":
        print(json.dumps([i.model_dump() for i in infos], indent=2))
        return
    if not infos:
        out.print(f"no committed checkpoints in {uri}")
        return
    t = Table(title=f"checkpoints in {uri}", title_justify="left")
    for col in ("step", "size", "saved by", "created", "location"):
        t.add_column(col)
    import time

    for i in infos:
        if i.error is not None:
            t.add_row(str(i.step), "[red]corrupt[/]", "-", "-", f"{escape(i.location)}: {escape(i.error)}")
            continue
        t.add_row(
            str(i.step),
            _human(i.total_bytes),
            f"{i.world_size} ranks",
            time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(i.created_at)),
            escape(i.location),
        )
    out.print(t)


@app.command()
def inspect(
    uri: Annotated[str, typer.Argument(help=URI_HELP)],
    step: Annotated[int, typer.Argument(help="The step to inspect.")],
    output: Annotated[str, typer.Option("--output", "-o", help="table or json")] = "table",
) -> None:
    """Show a checkpoint's tensors, shapes, the saving layout, sizes and checksums.

    Example: stalwart checkpoint inspect /ckpt/run1 1200
    """
    from stalwart.checkpoint import Checkpointer, ManifestError, NoCheckpoint

    try:
        _, manifest = Checkpointer(_open(uri)).manifest(step)
    except (NoCheckpoint, ManifestError) as exc:
        print_error(str(exc))
        raise typer.Exit(1) from None
    if output == "json":
        print(manifest.model_dump_json(indent=2))
        return
    lay = manifest.layout
    out.print(
        f"[bold]step {manifest.step}[/]  {_human(manifest.total_bytes)}  saved by {lay.world_size} ranks"
        + (f"  parallelism {lay.parallelism}" if lay.parallelism else ""),
        highlight=False,
    )
    out.print("  bytes per rank: " + ", ".join(_human(b) for b in lay.per_rank_bytes), highlight=False)
    t = Table(title="tensors", title_justify="left")
    for col in ("name", "dtype", "shape", "shards (offsets → file @ rank)", "xxh3"):
        t.add_column(col)
    for name, entry in sorted(manifest.tensors.items()):
        shards = "\n".join(f"{s.offsets} {s.lengths} → {s.file} @{s.rank}" for s in entry.shards)
        crcs = "\n".join(f"{s.checksum:016x}" for s in entry.shards)
        t.add_row(name, entry.dtype, str(tuple(entry.shape)), shards, crcs)
    out.print(t)
    if manifest.objects:
        o = Table(title="objects", title_justify="left")
        for col in ("name", "file", "bytes", "xxh3"):
            o.add_column(col)
        for name, obj in sorted(manifest.objects.items()):
            o.add_row(name, obj.file, str(obj.length), f"{obj.checksum:016x}")
        out.print(o)


@app.command("export-dcp")
def export_dcp_cmd(
    uri: Annotated[str, typer.Argument(help=URI_HELP)],
    step: Annotated[int, typer.Argument(help="The step to export.")],
    out_dir: Annotated[str, typer.Argument(help="A new folder for the DCP checkpoint.")],
) -> None:
    """Write a checkpoint as a plain DCP folder, for tools that read DCP by path.

    The files are rewritten from verified bytes and plain values; the folder's `.metadata` is
    built from the checkpoint's manifest (a Stalwart checkpoint holds no pickle). In Python, no
    export is needed: dcp.load(state, storage_reader=stalwart.checkpoint.DCPReader(URI, STEP)).

    Example: stalwart checkpoint export-dcp /ckpt/run1 1200 /tmp/run1-dcp-1200
    """
    from stalwart.checkpoint import CheckpointError, StorageError, export_dcp

    try:
        result = export_dcp(_open(uri), step, out_dir)
    except (CheckpointError, StorageError) as exc:
        print_error(str(exc))
        raise typer.Exit(1) from None
    out.print(
        f"exported step {result.step} ({result.tensors} tensors, {result.values} values, "
        f"{_human(result.bytes_written)}) to {result.folder}; read it with "
        f"torch.distributed.checkpoint.load(state, checkpoint_id={result.folder!r})",
        highlight=False,
    )


@app.command("import-torchsnapshot")
def import_torchsnapshot_cmd(
    source: Annotated[str, typer.Argument(help="Path of the torchsnapshot snapshot.")],
    uri: Annotated[str, typer.Argument(help=URI_HELP)],
    step: Annotated[int, typer.Option(help="Step to record the imported checkpoint under.")] = 0,
) -> None:
    """Convert a torchsnapshot snapshot into a Stalwart checkpoint.

    Example: stalwart checkpoint import-torchsnapshot /old/snap-1000 /ckpt/run1 --step 1000
    """
    from stalwart.checkpoint.torchsnapshot_import import import_torchsnapshot

    try:
        result = import_torchsnapshot(source, _open(uri), step)
    except (ValueError, RuntimeError) as exc:
        print_error(str(exc))
        raise typer.Exit(1) from None
    if not result.committed:
        print_error(f"import failed: {str(result.error)}")
        raise typer.Exit(1)
    out.print(f"imported {source} as step {step} ({_human(result.total_bytes)}) into {uri}", highlight=False)
