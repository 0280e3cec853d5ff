"""Loading the signature database: the packaged signatures.yaml, or another file (for tests and for
operators who extend it)."""

from __future__ import annotations

from functools import lru_cache
from importlib.resources import files
from pathlib import Path

import yaml
from pydantic import ValidationError

from stalwart.signatures.model import SignatureDatabase

DATA_FILE = "signatures.yaml"


class SignatureFileError(ValueError):
    pass


def parse_signatures(text: str, origin: str = DATA_FILE) -> SignatureDatabase:
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise SignatureFileError(f"{origin}: not valid YAML: {exc}") from None
    try:
        return SignatureDatabase.model_validate(doc)
    except ValidationError as exc:
        raise SignatureFileError(f"{origin}: {exc}") from None


def load_signatures(path: Path | str | None = None) -> SignatureDatabase:
    if path is None:
        return parse_signatures(files("stalwart.signatures").joinpath(DATA_FILE).read_text(encoding="utf-8"))
    p = Path(path)
    return parse_signatures(p.read_text(encoding="utf-8"), str(p))


@lru_cache(maxsize=1)
def default_database() -> SignatureDatabase:
    """The packaged database, parsed once per process."""
    return load_signatures()
