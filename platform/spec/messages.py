"""Short quotes of user input for error messages: a message names the field and the problem, and
quotes at most a few dozen characters of the value, never the megabyte someone pasted."""

from __future__ import annotations

QUOTE_CHARS = 48


def brief(value: object, limit: int = QUOTE_CHARS) -> str:
    """repr() of a scalar, cut to `limit` characters with its length said; a type name for the rest."""
    if isinstance(value, str | bytes):
        if len(value) <= limit:
            return repr(value)
        unit = "characters" if isinstance(value, str) else "bytes"
        return f"{value[:limit]!r}… ({len(value):,} {unit})"
    if isinstance(value, bool | int | float) or value is None:
        text = repr(value)
        return text if len(text) <= limit else f"{text[:limit]}… ({len(text):,} digits)"
    return f"a {type(value).__name__}"


def clip(text: str, limit: int = 200) -> str:
    """`text` itself when short, else its first `limit` characters and how long it was."""
    return text if len(text) <= limit else f"{text[:limit]}… ({len(text):,} characters)"
