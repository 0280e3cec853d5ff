"""`stalwart run`: a whole job on this machine."""

from stalwart.runner.local_run import JobAlreadyExists, LocalRun, RunResult

__all__ = ["JobAlreadyExists", "LocalRun", "RunResult"]
