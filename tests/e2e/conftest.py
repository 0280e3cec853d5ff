"""End-to-end tests run the example job's code on its data: build the shards once, here only."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from support.paths import REPO

from stalwart.spec import ALLOWED_PATHS_ENV


@pytest.fixture(scope="session", autouse=True)
def _example_data(example_shards: None) -> None:
    """Every end-to-end run may read the example's token shards; unit tests never pay for them."""


@pytest.fixture(scope="session", autouse=True)
def _allowed_paths() -> Iterator[None]:
    """The test jobs run code from examples/ and tests/data/ while their job files (and the agents'
    job folders) are elsewhere: allow those folders, as an administrator would (docs/security.md).
    Every `stalwart run`, controller and agent the tests start inherits it."""
    before = os.environ.get(ALLOWED_PATHS_ENV)
    os.environ[ALLOWED_PATHS_ENV] = os.pathsep.join([str(REPO / "examples"), str(REPO / "tests" / "data")])
    yield
    if before is None:
        os.environ.pop(ALLOWED_PATHS_ENV, None)
    else:
        os.environ[ALLOWED_PATHS_ENV] = before
