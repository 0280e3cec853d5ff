"""The on-call commands' --etcd and --diagnosis-url options; where they lead is stalwart.ops.connection."""

from __future__ import annotations

from typing import Annotated

import typer

from stalwart.ops.connection import DIAGNOSIS_ENV, ETCD_ENV

EtcdOption = Annotated[
    str | None,
    typer.Option("--etcd", metavar="HOST:PORT", help=f"etcd to read (default: ${ETCD_ENV}, then the config file)."),
]
DiagnosisUrlOption = Annotated[
    str | None,
    typer.Option(
        "--diagnosis-url",
        metavar="URL",
        help=f"Diagnosis service (default: ${DIAGNOSIS_ENV}, the config file, then the URL the service "
        "published in etcd).",
    ),
]
