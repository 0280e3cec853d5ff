"""Runbooks (markdown in runbooks/) as HTML for the incident pages: raw HTML and images are not
rendered, so a runbook can neither inject script nor make the browser fetch from another host."""

from __future__ import annotations

import functools
import re

from markdown_it import MarkdownIt
from markupsafe import Markup

from stalwart.runbooks import Runbook, UnknownRunbook, load_runbook


@functools.cache
def _renderer() -> MarkdownIt:
    md = MarkdownIt("commonmark", {"html": False, "linkify": False}).enable("table")
    md.disable("image")
    return md


_SIBLING = re.compile(r"^([a-z0-9_]+)\.md$")


def render_markdown(text: str, root: str = "") -> Markup:
    """HTML of a runbook; a link to another runbook (`hang.md`) becomes the console's page of it."""
    md = _renderer()
    tokens = md.parse(text)
    for token in tokens:
        for child in token.children or []:
            href = child.attrGet("href") if child.type == "link_open" else None
            if isinstance(href, str) and (sibling := _SIBLING.match(href)):
                child.attrSet("href", f"{root}/runbooks/{sibling.group(1)}")
    return Markup(md.renderer.render(tokens, md.options, {}))


@functools.lru_cache(maxsize=128)
def runbook_html(name: str, root: str = "") -> tuple[Runbook, Markup] | None:
    """The runbook and its HTML, or None when there is none of that name (the page says so)."""
    try:
        book = load_runbook(name)
    except UnknownRunbook:
        return None
    return book, render_markdown(book.text or "", root)
