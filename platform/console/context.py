"""What every route of the console shares: the store, the sign-in gate, the history, the settings, the
page renderer, the cache of costly answers and the metrics. create_app builds one per app and keeps
it on `app.state`; a route asks for it with `Ctx`."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Annotated, Any

from fastapi import Depends, Request
from prometheus_client import CollectorRegistry, Counter, Histogram
from pydantic import BaseModel

from stalwart.console.access import Gate
from stalwart.console.history import History
from stalwart.console.rendering import Pages
from stalwart.store.client import Store


class ConsoleConfig(BaseModel):
    refresh_seconds: float = 2.0
    allowed_hosts: list[str] = ["*"]
    secure_cookies: bool = False  # set behind HTTPS
    # Serves a Kubernetes cluster: suspend and resume patch the TrainingJob (stalwart.console.actions).
    kubernetes: bool = False


class AnswerCache:
    """Answers that cost the agents work (log tails, stacks), shared by every viewer for a moment."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._locks: dict[Any, threading.Lock] = {}
        self._values: dict[Any, tuple[float, Any]] = {}

    def get(self, key: Any, max_age: float, make: Callable[[], Any]) -> Any:
        with self._lock:
            lock = self._locks.setdefault(key, threading.Lock())
        with lock:  # one capture per key at a time; the others wait for it and share it
            hit = self._values.get(key)
            if hit is not None and time.monotonic() - hit[0] < max_age:
                return hit[1]
            value = make()
            self._values[key] = (time.monotonic(), value)
            if len(self._values) > 256:
                self._values.pop(next(iter(self._values)))
            return value


@dataclass
class ConsoleMetrics:
    """The console's own Prometheus metrics, in a registry of its own (one per app)."""

    registry: CollectorRegistry = field(default_factory=lambda: CollectorRegistry(auto_describe=True))

    def __post_init__(self) -> None:
        self.http_seconds = Histogram(
            "stalwart_console_http_request_duration_seconds",
            "HTTP requests answered, from arrival to the response, by method, route and status.",
            ("method", "route", "status"),
            registry=self.registry,
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
        )
        self.actions_taken = Counter(
            "stalwart_console_actions",
            "Actions taken from the console (each audited), by action.",
            ("action",),
            registry=self.registry,
        )


@dataclass
class ConsoleContext:
    store: Store
    gate: Gate
    history: History | None
    config: ConsoleConfig
    pages: Pages
    cache: AnswerCache = field(default_factory=AnswerCache)
    metrics: ConsoleMetrics = field(default_factory=ConsoleMetrics)


def console_context(request: Request) -> ConsoleContext:
    found: ConsoleContext = request.app.state.console
    return found


Ctx = Annotated[ConsoleContext, Depends(console_context)]
