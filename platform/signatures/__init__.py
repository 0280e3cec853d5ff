"""Log signatures: a database of worker-output patterns and exit codes, and a streaming scanner."""

from stalwart.signatures.loader import default_database, load_signatures
from stalwart.signatures.model import BlameScope, FailureClassSpec, SignatureDatabase
from stalwart.signatures.scanner import ExitVerdict, LogScanner, SignatureMatch, classify_exit

__all__ = [
    "BlameScope",
    "ExitVerdict",
    "FailureClassSpec",
    "LogScanner",
    "SignatureDatabase",
    "SignatureMatch",
    "classify_exit",
    "default_database",
    "load_signatures",
]
