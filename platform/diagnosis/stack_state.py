"""What a rank is doing, read from its normalized frames: waiting in a collective, in a pipeline
send or receive, or active (computing, sleeping, looping in user code).

In a hang almost every rank waits in communication for the few that do not; the ones that do not,
and the ones whose wait can never end, are where the fault is. The pipeline direction and phase
come from Megatron-core's function names (recv_forward, send_backward, forward_step,
finalize_model_grads, ...), which other frameworks largely share; without them a wait is still a
wait, only its peer is unknown.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum

from stalwart.diagnosis.stack_parse import ParsedStack

_COLLECTIVES = {
    "all_reduce",
    "all_gather",
    "all_gather_into_tensor",
    "_all_gather_base",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "_reduce_scatter_base",
    "broadcast",
    "barrier",
    "monitored_barrier",
    "reduce",
    "all_to_all",
    "all_to_all_single",
    "gather",
    "scatter",
    "all_gather_object",
    "broadcast_object_list",
    "gather_object",
    "all_reduce_coalesced",
    "new_group",
    "init_process_group",
}
_P2P_RECV = {"recv", "irecv", "recv_object_list"}
_P2P_SEND = {"send", "isend", "send_object_list"}
_P2P_BATCH = {"batch_isend_irecv"}
_DIST_FILES = ("distributed_c10d.py", "c10d_logger.py", "rendezvous.py")
_NATIVE_WAIT = re.compile(
    r"(Work::wait|waitRecv|waitSend|UnboundBuffer::wait|ProcessGroup\w*::\w*wait|"
    r"Reducer::finalize|ncclGroupEnd|ncclKernel|NCCLComm)",
    re.IGNORECASE,
)
_NATIVE_RECV = re.compile(r"RecvWork|waitRecv", re.IGNORECASE)
_NATIVE_SEND = re.compile(r"SendWork|waitSend", re.IGNORECASE)
# Frames that wait on the autograd engine: the rank may be computing or waiting for DDP's reducer.
_AMBIGUOUS = {
    "backward (_tensor.py)",
    "Tensor.backward (_tensor.py)",
    "_engine_run_backward (graph.py)",
    "backward (__init__.py)",
}


class State(str, Enum):
    ACTIVE = "active"
    COLLECTIVE = "collective"
    P2P_RECV = "p2p-recv"
    P2P_SEND = "p2p-send"
    UNKNOWN = "unknown"

    @property
    def waiting(self) -> bool:
        return self in (State.COLLECTIVE, State.P2P_RECV, State.P2P_SEND)


class Phase(int, Enum):
    """Where in a training step; a later phase means the rank got further."""

    UNKNOWN = -1
    FORWARD = 1
    BACKWARD = 2
    SYNC = 3  # gradient reduction and the optimizer step: the pipeline is done


@dataclass(frozen=True)
class RankState:
    state: State
    op: str = ""  # the communication call, e.g. all_reduce, recv
    direction: str = ""  # pipeline direction of a p2p op: forward | backward
    phase: Phase = Phase.UNKNOWN
    scope: str = ""  # the group a collective runs in, when the frames say: tp | dp | mp | pp | cp | ep
    where: str = ""  # the innermost frame outside torch.distributed (for humans)


def _fn(frame: str) -> str:
    return frame.split(" (", 1)[0]


def _file(frame: str) -> str:
    return frame.rsplit(" (", 1)[-1].rstrip(")")


def _phase(names: list[str]) -> Phase:
    """From the outermost marker inward the last one wins: forward_step inside a backward is still forward."""
    phase = Phase.UNKNOWN
    for name in reversed(names):  # outermost first
        low = name.lower()
        if (
            "finalize_model_grads" in low
            or "optimizer" in low
            or "grad_norm" in low
            or "grad_sync" in low
            or low in ("step", "clip_grad_norm_")
        ):
            phase = Phase.SYNC
        elif "backward" in low and "forward_backward" not in low:
            phase = Phase.BACKWARD
        elif "forward" in low and "forward_backward" not in low:
            phase = Phase.FORWARD
    return phase


def _scope(names: list[str]) -> str:
    for name in names:
        low = name.lower()
        if "tensor_model_parallel" in low or "tensor_parallel" in low or low.startswith("_reduce"):
            return "tp"
        if "context_parallel" in low:
            return "cp"
        if "expert" in low:
            return "ep"
        if "grad_norm" in low or "model_parallel" in low:
            return "mp"
        if "data_parallel" in low or "finalize_model_grads" in low or "grad_sync" in low or "param_sync" in low:
            return "dp"
    return ""


def _direction(names: list[str]) -> str:
    """Megatron's p2p_communication names say which way a pipeline transfer goes."""
    for name in names:
        if name in ("recv_forward", "send_forward"):
            return "forward"
        if name in ("recv_backward", "send_backward"):
            return "backward"
    return ""


def classify(parsed: ParsedStack) -> RankState:
    """The rank's state from its kept thread's frames (innermost first)."""
    if parsed.empty:
        return RankState(State.UNKNOWN)
    py = list(parsed.frames)
    outside = [f for f in py if _file(f) not in _DIST_FILES]
    own = [_fn(f) for f in outside]  # the caller's names: torch's own say nothing about the group
    where = outside[0] if outside else (py[0] if py else parsed.native[0] if parsed.native else "")
    phase = _phase(own)
    op = ""
    state: State | None = None
    for f in py:
        if _file(f) not in _DIST_FILES:
            continue
        name = _fn(f)
        if name in _COLLECTIVES:
            state, op = State.COLLECTIVE, name
        elif name in _P2P_RECV:
            state, op = State.P2P_RECV, name
        elif name in _P2P_SEND:
            state, op = State.P2P_SEND, name
        elif name in _P2P_BATCH:
            state, op = State.P2P_RECV, name
        if state is not None:
            break
    if state is None:
        waits = [n for n in parsed.native if _NATIVE_WAIT.search(n)]
        if waits:
            if any(_NATIVE_RECV.search(n) for n in waits):
                state, op = State.P2P_RECV, "recv"
            elif any(_NATIVE_SEND.search(n) for n in waits):
                state, op = State.P2P_SEND, "send"
            else:
                state, op = State.COLLECTIVE, "wait"
        elif py and py[0] in _AMBIGUOUS and not parsed.native:
            state = State.UNKNOWN
        else:
            state = State.ACTIVE
    direction = ""
    scope = ""
    if state in (State.P2P_RECV, State.P2P_SEND):
        direction = _direction(own)
        scope = "pp"
    elif state is State.COLLECTIVE:
        scope = _scope(own)
    return RankState(state=state, op=op, direction=direction, phase=phase, scope=scope, where=where)
