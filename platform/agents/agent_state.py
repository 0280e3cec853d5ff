"""The node agent's named states, and the only transitions between them.

             job state lists the node as a standby (read once, at registration)
        IDLE  ─────────────────────────────────────────►  STANDBY
         ▲                                                 │ (a dropped standby is
         │                                                 │  stopped by the controller)
         │                                                 │ RUN (promoted: it takes a slot's ranks)
         │ workers stopped                                 ▼
      STOPPING ◄──────── STOP, or RUN of a newer ──────  RUNNING ◄── RUN (IDLE: a slot's first generation)
         │               generation                       ▲
         └──────────── RUN: the next generation starts ───┘

    any state ── lease lost (the controller replaced this node) ──► FENCED  (the agent exits)

A standby keeps the newest checkpoint and the data loader's position warm (stalwart.agents.standby);
an idle node holds a slot but has no workers (before its first generation, or after a stop).
"""

from __future__ import annotations

from enum import Enum


class AgentState(str, Enum):
    IDLE = "idle"
    STANDBY = "standby"
    RUNNING = "running"  # a generation's workers are up (or exited and not yet restarted)
    STOPPING = "stopping"
    FENCED = "fenced"


TRANSITIONS: dict[AgentState, frozenset[AgentState]] = {
    AgentState.IDLE: frozenset({AgentState.STANDBY, AgentState.RUNNING, AgentState.FENCED}),
    AgentState.STANDBY: frozenset({AgentState.IDLE, AgentState.RUNNING, AgentState.FENCED}),
    AgentState.RUNNING: frozenset({AgentState.STOPPING, AgentState.FENCED}),
    AgentState.STOPPING: frozenset({AgentState.IDLE, AgentState.RUNNING, AgentState.FENCED}),
    AgentState.FENCED: frozenset(),
}


class BadTransition(RuntimeError):
    pass


def check_transition(current: AgentState, new: AgentState) -> None:
    if new not in TRANSITIONS[current]:
        raise BadTransition(f"the agent cannot go from {current.value} to {new.value}")
