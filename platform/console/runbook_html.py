"""Runbooks (markdown in runbooks/) as HTML for the incident pages: raw HTML and images are not
rendered, so a runbook can neither inject script nor make the browser fetch from another host."""

from __future__ import annotations

import functools

from markdown_it import MarkdownIt
from markupsafe import Markup

from stalwart.runbooks import Runbook, UnknownRunbook, load_runbook


@functools.cache
def _renderer() -> MarkdownIt:
    md = MarkdownIt("commonmark", {"html": False, "linkify": False}).enable("table")
    md.disable("image")
    return md


def render_markdown(text: str) -> Markup:
    return Markup(_renderer().render(text))


@functools.lru_cache(maxsize=64)
def runbook_html(name: str) -> tuple[Runbook, Markup] | None:
    """The runbook and its HTML, or None when there is none of that name (the page says so)."""
    try:
        book = load_runbook(name)
    except UnknownRunbook:
        return None
    return book, render_markdown(book.text or "")
