"""Which way the acting commands go (etcd or the Kubernetes API), and -n/--namespace with etcd."""

from __future__ import annotations

from pathlib import Path

import pytest

from stalwart.ops.actions import PREFER_KUBERNETES_ENV, EtcdActions, open_actions
from stalwart.ops.errors import OpsError
from stalwart.store import Store, keys
from stalwart.store.records import JobState


@pytest.fixture
def nowhere(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """No etcd configured and no kubeconfig."""
    for name in ("STALWART_ETCD", "KUBERNETES_SERVICE_HOST", PREFER_KUBERNETES_ENV):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("STALWART_CONFIG", str(tmp_path / "none.yaml"))
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "no-kubeconfig"))
    return tmp_path


def test_with_nothing_to_act_through_the_error_says_what_to_set(nowhere: Path) -> None:
    with pytest.raises(OpsError, match="--etcd HOST:PORT.*kubeconfig"), open_actions(None, "ml"):
        pass


def test_with_etcd_the_namespace_qualifies_the_job(nowhere: Path, store: Store) -> None:
    store.put(keys.job_state("ml.demo"), JobState(job="ml.demo", created_at=0.0, updated_at=0.0))
    with open_actions(store.endpoint, "ml") as actions:
        assert isinstance(actions, EtcdActions) and actions.store is not None
        assert actions.job_id("demo") == "ml.demo" and actions.job_id("ml.demo") == "ml.demo"
        assert actions.is_job("demo") and not actions.is_job("other")
        with pytest.raises(OpsError, match="no spec in etcd"):  # the etcd path edits ml.demo's spec
            actions.suspend("demo", True, 1.0)
