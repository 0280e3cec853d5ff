"""End-to-end tests run the example job's code on its data: build the shards once, here only."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session", autouse=True)
def _example_data(example_shards: None) -> None:
    """Every end-to-end run may read the example's token shards; unit tests never pay for them."""
