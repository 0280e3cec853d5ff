"""A real S3 protocol server for tests: moto's server on a loopback port it binds itself, with a bucket."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest


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
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)  # port 0: none to lose
    server.start()
    endpoint = f"http://127.0.0.1:{server.get_host_and_port()[1]}"
    boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").create_bucket(Bucket=bucket)
    try:
        yield endpoint
    finally:
        server.stop()
