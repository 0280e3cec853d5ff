"""Reusable staging buffers: the host copy of a snapshot, which the writer serializes while training runs.

Buffers are allocated once per (tensor, shard) and reused by every later save. For a GPU tensor
the buffer is pinned and the device-to-host copy is queued on a stream of its own, after the work
the training stream had queued when the save began, so the copy overlaps the next forward and
backward; `fence()` marks the copies queued so far, for the optimizer step to wait on (on the GPU,
not on the host) and for the writer to wait on before it reads a buffer. (The CUDA path was
measured on one H100, docs/gpu.md; this project's own machines have no GPU.)
"""

from __future__ import annotations

from typing import Any

import torch
from torch.distributed.checkpoint.metadata import MetadataIndex


class StagingBuffers:
    def __init__(self) -> None:
        self._buffers: dict[MetadataIndex, torch.Tensor] = {}
        self._streams: dict[torch.device, Any] = {}
        self._start: dict[torch.device, Any] = {}  # the training stream's position when save() began
        self._ordered: set[torch.device] = set()  # devices whose staging stream waits on that already

    def begin(self) -> None:
        """Called by save() on the training thread: copies queued from now on see the state as of now."""
        self._start, self._ordered = {}, set()
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            device = torch.device("cuda", torch.cuda.current_device())
            event = torch.cuda.Event()
            event.record(torch.cuda.current_stream(device))
            self._start[device] = event

    def _stream(self, device: torch.device) -> Any:
        if device not in self._streams:
            self._streams[device] = torch.cuda.Stream(device=device)
        stream = self._streams[device]
        if device not in self._ordered:
            start = self._start.get(device)
            if start is None:  # another device than the training thread's: after its default stream
                start = torch.cuda.Event()
                start.record(torch.cuda.default_stream(device))
            stream.wait_event(start)
            self._ordered.add(device)
        return stream

    def stage(self, index: MetadataIndex, src: torch.Tensor) -> torch.Tensor:
        src = src.detach()
        buf = self._buffers.get(index)
        if buf is None or buf.shape != src.shape or buf.dtype != src.dtype:
            buf = torch.empty(src.shape, dtype=src.dtype, device="cpu", pin_memory=src.is_cuda)
            self._buffers[index] = buf
        if src.is_cuda:
            with torch.cuda.stream(self._stream(src.device)):
                buf.copy_(src, non_blocking=True)
        else:
            buf.copy_(src)
        return buf

    def fence(self) -> list[Any]:
        """CUDA events marking the copies queued so far (none on a CPU-only process)."""
        events = []
        for stream in self._streams.values():
            event = torch.cuda.Event()
            event.record(stream)
            events.append(event)
        return events

    @staticmethod
    def wait_on_host(events: list[Any]) -> None:
        for event in events:
            event.synchronize()

    @staticmethod
    def wait_on_device(events: list[Any]) -> None:
        """Make the calling thread's current CUDA stream wait for the copies (the host goes on)."""
        for event in events:
            torch.cuda.current_stream().wait_event(event)

    @property
    def nbytes(self) -> int:
        return sum(b.numel() * b.element_size() for b in self._buffers.values())
