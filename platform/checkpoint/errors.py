"""What can go wrong with a checkpoint, as exception types a training script can catch.

`ChecksumError` (and `ManifestError`, its kind for the commit marker) means the stored bytes are not
what was saved: `load(..., fallback=True)` skips such a checkpoint for the one before it.
`UnsafeObjectError` means a non-tensor value is outside what a checkpoint may hold: it is refused
on save, and on load nothing of it is executed.
"""

from __future__ import annotations


class CheckpointError(RuntimeError):
    pass


class NoCheckpoint(CheckpointError):
    pass


class ChecksumError(CheckpointError):
    """Bytes read back do not match what was saved; names the tensor (or object) and the file."""


class ManifestError(ChecksumError):
    """A commit marker that cannot be read, fails its digest, or describes an impossible checkpoint."""


class UnsafeObjectError(CheckpointError):
    """A non-tensor value that a checkpoint may not hold (it would need code to be run to load)."""
