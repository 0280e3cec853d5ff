"""The controller's core: observation in, decision out, no I/O.

Phases and the transition table (transitions.py), the observation and decision types
(observation.py, decision.py, work.py), the decision itself (reconcile.py) and what it is made of:
the detectors (detectors/), the failure ladder and its policies (ladder.py, policy.py), the standby
pool (standbys.py), the dual-phase replay (replay.py), operator requests (requests.py), node checks
(checks.py), generations and rank assignment (generation.py, ranks.py), progress and the checkpoint
catalog (progress.py, catalog.py), suspension (suspension.py) and what the nodes should be doing
(world.py). An import contract (.importlinter) keeps I/O out: the shell (stalwart.controller.shell)
reads, writes and waits.
"""
