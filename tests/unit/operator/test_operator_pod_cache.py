"""KubernetesCluster's node list from the pod cache: one LIST, then the watch's events (fed here as
the operator's kopf handler feeds them), LISTs again only when kopf re-lists, on a schedule, or to
retry; against the emulated API, counting its LIST calls."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import kubernetes
import pytest
from support.kubesim import ApiServer, job_cluster, raw

from stalwart.logs import get_logger
from stalwart.spec import parse_job
from stalwart.store import Store, keys
from stalwart_operator import crd, names, pod_cache
from stalwart_operator.pod_cache import PodCache

BOUND = 30.0  # seconds any wait below may take on a starved machine; a healthy run takes milliseconds


def _until(what: str, predicate: Callable[[], Any]) -> Any:
    deadline = time.monotonic() + BOUND
    while time.monotonic() < deadline:
        if value := predicate():
            return value
        time.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture(scope="module")
def api() -> Iterator[ApiServer]:
    server = ApiServer(crd.crd()).start()
    yield server
    server.stop()


@pytest.fixture
def fast(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pod_cache, "RELIST_SETTLE_SECONDS", 0.01)
    monkeypatch.setattr(pod_cache, "BACKOFF_FIRST_SECONDS", 0.01)


def _lists(api: ApiServer) -> int:
    assert api.emulator is not None
    return sum(1 for _, group, plural, verb in api.emulator.calls if (group, plural, verb) == ("", "pods", "list"))


def test_the_node_list_follows_pod_events_without_listing(api: ApiServer, store: Store, fast: None) -> None:
    job = parse_job(
        {
            "apiVersion": "stalwart.dev/v1alpha1",
            "kind": "TrainingJob",
            "metadata": {"name": "pc"},
            "spec": {"roles": [{"name": "trainer", "replicas": 2, "command": ["python", "t.py"]}]},
        }
    )
    job_id = names.job_id("default", "pc")
    store.delete_prefix(keys.job_prefix(job_id))
    core = kubernetes.client.CoreV1Api(api.client())
    cluster = job_cluster(api, store, job, "uid-pc")
    pod = names.pod_name("pc", "node-1")

    def alive() -> dict[str, bool]:
        return {n.name: n.alive for n in cluster.list_nodes()}

    try:
        before = _lists(api)
        cluster.start_node("node-0")
        cluster.start_node("node-1")
        assert alive() == {"node-0": True, "node-1": True}
        assert _lists(api) == before + 1  # the first read
        for _ in range(50):  # the controller's ticks and the status mirror
            alive()
            cluster.list_pods()
        cluster.start_node("node-2")  # our own write shows at once (read your own writes)
        assert alive() == {"node-0": True, "node-1": True, "node-2": True}
        # The watch says a pod failed, then that another was deleted (kubectl delete): both show at once.
        failed = raw(
            core.patch_namespaced_pod_status(pod, "default", {"status": {"phase": "Failed"}}, _preload_content=False)
        )
        cluster.pod_event("MODIFIED", failed)
        assert alive()["node-1"] is False
        gone = raw(core.delete_namespaced_pod(names.pod_name("pc", "node-2"), "default", _preload_content=False))
        cluster.pod_event("DELETED", gone)
        assert alive() == {"node-0": True, "node-1": False}
        cluster.pod_event("MODIFIED", gone)  # a late event of the deleted pod does not bring it back
        assert "node-2" not in alive()
        # The node is replaced by a pod of the same name (a new uid); the old pod's late DELETED
        # leaves the new one alone.
        cluster.stop_node("node-1")
        assert "node-1" not in alive()
        cluster.start_node("node-1")
        cluster.pod_event("DELETED", failed)
        assert alive() == {"node-0": True, "node-1": True}
        # Scheduled: the machine is remembered after the pod is gone (cordon follows stop).
        placed = raw(core.patch_namespaced_pod(pod, "default", {"spec": {"nodeName": "gpu-3"}}, _preload_content=False))
        cluster.pod_event("MODIFIED", placed)
        assert cluster.machine_of("node-1") == "gpu-3"
        assert _lists(api) == before + 1  # none of that LISTed
        # A deletion the watch never reported (it broke, and kopf re-listed): the re-list's events
        # make the cache LIST once more, and the pod is gone from it.
        core.delete_namespaced_pod(names.pod_name("pc", "node-0"), "default", _preload_content=False)
        assert alive()["node-0"] is True  # nothing said so yet
        cluster.pods.relisted()
        _until("the LIST after the re-list", lambda: _lists(api) == before + 2 and "node-0" not in alive())
        assert alive() == {"node-1": True} and cluster.machine_of("node-1") == "gpu-3"
    finally:
        for node in ("node-0", "node-1", "node-2"):
            cluster.stop_node(node)
        cluster.close()
        store.delete_prefix(keys.job_prefix(job_id))


def _pod(name: str, uid: str, phase: str = "Running") -> dict[str, Any]:
    return {
        "metadata": {"name": name, "uid": uid, "labels": {names.NODE_LABEL: name}},
        "status": {"phase": phase},
    }


def _cache(lister: Callable[[], list[dict[str, Any]]]) -> PodCache:
    return PodCache(lister, node_of=lambda p: p["metadata"]["labels"].get(names.NODE_LABEL), log=get_logger("test"))


def test_an_event_during_a_list_is_not_hidden_by_its_answer(fast: None) -> None:
    """The LIST was answered before a deletion whose event arrived while the answer was on its way."""
    a, b = _pod("a", "u-a"), _pod("b", "u-b")
    cache = _cache(lambda: [a, b])
    answers: list[list[dict[str, Any]]] = []

    def racing() -> list[dict[str, Any]]:
        cache.apply("DELETED", b)
        cache.apply("MODIFIED", _pod("a", "u-a", "Failed"))
        return answers.pop(0)

    try:
        assert {p["metadata"]["name"] for p in cache.pods()} == {"a", "b"}
        cache._lister = racing
        answers.append([a, b])
        cache.relisted()
        _until("the resync", lambda: cache.lists == 2)
        assert [(p["metadata"]["name"], p["status"]["phase"]) for p in cache.pods()] == [("a", "Failed")]
    finally:
        cache.close()


def test_a_failed_list_keeps_the_last_answer_and_retries_with_backoff(fast: None) -> None:
    answers: list[Any] = [[_pod("a", "u-a")], RuntimeError("api server down"), RuntimeError("still down"), []]
    gate = threading.Event()  # holds the LIST that succeeds until the test has looked

    def lister() -> list[dict[str, Any]]:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        if not answer:
            gate.wait(BOUND)
        return answer  # type: ignore[no-any-return]

    cache = _cache(lister)
    try:
        assert [p["metadata"]["name"] for p in cache.pods()] == ["a"]
        cache.relisted()
        _until("two failed LISTs and the retry under way", lambda: cache.lists == 3 and not answers)
        assert [p["metadata"]["name"] for p in cache.pods()] == ["a"]  # the last answer, meanwhile
        gate.set()
        _until("the retry that succeeds", lambda: cache.lists == 4 and not cache.pods())
    finally:
        gate.set()
        cache.close()


def test_only_the_first_list_raises() -> None:
    """Before it there is nothing to answer with: the controller's tick fails and is retried."""

    def down() -> list[dict[str, Any]]:
        raise RuntimeError("api server down")

    cache = _cache(down)
    with pytest.raises(RuntimeError, match="api server down"):
        cache.pods()
    cache.close()


def test_a_periodic_resync_and_a_closed_cache_lists_again(fast: None) -> None:
    listed: list[int] = []

    def lister() -> list[dict[str, Any]]:
        listed.append(1)
        return [_pod("a", "u-a")]

    cache = _cache(lister)
    cache.resync_seconds = 0.05
    try:
        cache.pods()
        _until("a periodic LIST", lambda: len(listed) >= 2)
    finally:
        cache.close()
    count = len(listed)
    cache.resync_seconds = pod_cache.RESYNC_SECONDS
    assert cache.pods() and len(listed) == count + 1  # closed (a parked controller): the next read LISTs
    cache.close()
