"""End-to-end tests run the example job's code on its data: build the shards once, here only. Their
local clusters attach to one agent zygote per pytest worker (support.shared_zygote)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from support.paths import REPO
from support.shared_zygote import shared_zygote

from stalwart.cluster.agent_zygote import ZYGOTE_ENV
from stalwart.spec import ALLOWED_PATHS_ENV


@pytest.fixture(scope="session", autouse=True)
def _example_data(example_shards: None) -> None:
    """Every end-to-end run may read the example's token shards; unit tests never pay for them."""


@pytest.fixture(scope="session", autouse=True)
def _allowed_paths() -> Iterator[None]:
    """The test jobs run code from examples/ and tests/data/ while their job files (and the agents'
    job folders) are elsewhere: allow those folders, as an administrator would (docs/security.md).
    Every `stalwart run`, controller and agent the tests start inherits it."""
    with pytest.MonkeyPatch.context() as env:
        env.setenv(ALLOWED_PATHS_ENV, os.pathsep.join([str(REPO / "examples"), str(REPO / "tests" / "data")]))
        yield


@pytest.fixture(scope="session", autouse=True)
def _shared_agent_zygote(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Every `stalwart run` (and so its controllers) inherits the setting and attaches. Where the
    session was given a setting (`STALWART_AGENT_ZYGOTE=1`: a zygote per cluster), it keeps that."""
    if ZYGOTE_ENV in os.environ:
        yield
        return
    log = tmp_path_factory.mktemp("shared-zygote") / "zygote.log"
    with shared_zygote(log) as path, pytest.MonkeyPatch.context() as env:
        env.setenv(ZYGOTE_ENV, str(path))
        yield
