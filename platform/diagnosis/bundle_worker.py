"""What a diagnosis worker process does with one request body: gunzip it (a streaming bound on the
decompressed size), validate it as an EvidenceBundle, diagnose it, and answer with the verdict's
JSON or the problem's status and message.

It runs in a process of its own (stalwart.diagnosis.worker_pool), so decoding and validating a
hundred megabytes, which hold the GIL for seconds, never stall the service's event loop (/healthz),
and a bundle that needs more memory than the worker may use fails alone.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import time
import zlib
from dataclasses import dataclass, field

from pydantic import ValidationError

from stalwart.diagnosis.problems import validation_problem
from stalwart.processes import die_with_parent

INPUT_CHUNK = 1024 * 1024  # compressed bytes fed to the inflater at a time
WORKER_NICENESS = 10


class BodyTooLarge(ValueError):
    pass


class BadGzip(ValueError):
    pass


@dataclass
class WorkResult:
    status: int
    body: bytes  # JSON: the verdict (200) or {"detail": ...}
    kind: str = ""
    failure_class: str = ""
    seconds: float = 0.0
    headers: dict[str, str] = field(default_factory=dict)


def gunzip_bounded(data: bytes | bytearray, max_decoded: int) -> bytearray:
    """One gzip member, inflated a chunk at a time and refused (BodyTooLarge) as soon as its output
    passes `max_decoded`: a bomb costs at most that much memory and that much work."""
    inflater = zlib.decompressobj(wbits=31)
    out = bytearray()
    consumed = 0
    try:
        while consumed < len(data) and not inflater.eof:
            pending = data[consumed : consumed + INPUT_CHUNK]
            consumed += len(pending)
            while pending:
                # max_length is at least 1 here (0 would mean "no limit").
                out += inflater.decompress(pending, max_decoded + 1 - len(out))
                if len(out) > max_decoded:
                    raise BodyTooLarge
                pending = inflater.unconsumed_tail
    except zlib.error as exc:
        raise BadGzip(str(exc)) from None
    if not inflater.eof:
        raise BadGzip("the gzip stream is truncated")
    if inflater.unused_data or consumed < len(data):
        raise BadGzip("data after the end of the gzip stream")
    return out


def _json(detail: str) -> bytes:
    return json.dumps({"detail": detail}).encode()


def diagnose_body(body: bytes | bytearray, gzipped: bool, max_decoded: int) -> WorkResult:
    """The whole heavy path of POST /v1/diagnose, for one body as it was sent."""
    from stalwart.diagnosis.engine import diagnose, resolve_kind
    from stalwart.diagnosis.models import EvidenceBundle

    try:
        if gzipped:
            try:
                body = gunzip_bounded(body, max_decoded)
            except BodyTooLarge:
                return WorkResult(413, _json(f"decompressed request body exceeds {max_decoded / (1 << 20):g} MiB"))
            except BadGzip as exc:
                return WorkResult(400, _json(f"request body is not valid gzip: {exc}"))
        try:
            bundle = EvidenceBundle.model_validate_json(body)
        except ValidationError as exc:
            status, payload = validation_problem(exc.errors(include_input=False, include_url=False))
            return WorkResult(status, json.dumps(payload).encode())
        del body
        kind = resolve_kind(bundle)
        started = time.perf_counter()
        verdict = diagnose(bundle)
        seconds = time.perf_counter() - started
        return WorkResult(200, verdict.model_dump_json().encode(), kind, verdict.failure_class, seconds)
    except MemoryError:
        return WorkResult(
            413, _json("the bundle needs more memory than a diagnosis worker may use (send fewer or shorter stacks)")
        )


def ready() -> bool:
    """Nothing: what the service sends a worker to have it started (WorkerPool.warm)."""
    return True


def init_worker(memory_limit_bytes: int) -> None:
    """In each worker: die with the service (nothing else would stop a worker whose service was
    SIGKILLed), yield the CPU to it, cap its address space, and import the engine before the first
    bundle arrives."""
    die_with_parent()
    if os.getppid() == 1:
        os._exit(0)  # the service is already gone
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C stops the service, which stops us
    os.nice(WORKER_NICENESS)  # batch work: the service's event loop (/healthz) comes first for the CPU
    import stalwart.diagnosis.engine  # noqa: F401

    if memory_limit_bytes > 0:
        mapped = _mapped_bytes()
        _, hard = resource.getrlimit(resource.RLIMIT_AS)
        limit = mapped + memory_limit_bytes
        if hard == resource.RLIM_INFINITY or limit <= hard:
            resource.setrlimit(resource.RLIMIT_AS, (limit, hard))


def _mapped_bytes() -> int:
    """This process's address space now (VmSize): the limit counts what it may add to it."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmSize:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0
