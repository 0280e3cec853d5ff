"""A real S3 protocol server for tests: moto's server on a free loopback port, with a bucket."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from stalwart.net import free_port


@contextmanager
def moto_s3(monkeypatch: pytest.MonkeyPatch, bucket: str = "ckpt") -> Iterator[str]:
    """The endpoint URL of a moto server holding `bucket`, with test credentials in the environment."""
    import boto3
    from moto.server import ThreadedMotoServer

    for key, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(key, value)
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").create_bucket(Bucket=bucket)
    try:
        yield endpoint
    finally:
        server.stop()
