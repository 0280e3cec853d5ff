"""Finding `stalwart ...` commands in markdown and checking them against the real command tree.

Runbooks, docs/oncall.md and the README cite commands; a renamed command or option must break a
test, not a person at 3 a.m. The check walks click's tree (typer builds it): every group and command
word must exist, every option must be one the command declares, and there must not be more
positional words than the command has arguments. Placeholders (JOB, NODE, ID) pass as arguments.
"""

from __future__ import annotations

import functools
import re
import shlex

import typer

from stalwart.cli.main import app

FENCE = re.compile(r"^```[a-z]*\n(.*?)^```", re.MULTILINE | re.DOTALL)
SEPARATORS = {"|", "||", "&&", ";", ">", ">>", "<"}


@functools.cache
def command_tree():  # type: ignore[no-untyped-def]
    """The click command tree typer builds (typer may carry its own click: duck-typed throughout)."""
    return typer.main.get_command(app)


def is_group(cmd) -> bool:  # type: ignore[no-untyped-def]
    return hasattr(cmd, "list_commands")


def _get(group, name: str):  # type: ignore[no-untyped-def]
    return group.get_command(typer.Context(group), name)


def code_blocks(markdown: str) -> list[str]:
    return FENCE.findall(markdown)


def stalwart_commands(markdown: str) -> list[list[str]]:
    """Each `stalwart ...` line of the code blocks, as the words after `stalwart` (to a pipe or `#`)."""
    found = []
    for block in code_blocks(markdown):
        for line in block.splitlines():
            line = line.strip().removeprefix("$ ")
            if not line or line.startswith("#"):
                continue
            words = shlex.split(line, comments=True)
            start = next((i for i, w in enumerate(words) if w == "stalwart" or w.endswith("/stalwart")), None)
            if start is None:
                continue
            rest = words[start + 1 :]
            end = next((i for i, w in enumerate(rest) if w in SEPARATORS), len(rest))
            found.append(rest[:end])
    return found


def check_command(words: list[str]) -> str | None:
    """None if the words name a real command with real options; else what is wrong."""
    cmd = command_tree()
    path = ["stalwart"]
    i = 0
    while is_group(cmd):
        if i == len(words):
            return None  # a bare group shows its help
        word = words[i]
        if word.startswith("-"):
            if word.split("=")[0] not in _options(cmd):
                return f"{' '.join(path)}: no option {word}"
            i += 1
            continue
        sub = _get(cmd, word)
        if sub is None:
            return f"{' '.join(path)}: no command {word!r}"
        cmd, path = sub, [*path, word]
        i += 1
    options = _options(cmd)
    takes_value = {o for p in cmd.params if p.param_type_name == "option" and not p.is_flag for o in p.opts}
    arguments = [p for p in cmd.params if p.param_type_name == "argument"]
    max_positional = sum(a.nargs if a.nargs > 0 else 10_000 for a in arguments)
    positional = 0
    rest = words[i:]
    j = 0
    while j < len(rest):
        word = rest[j]
        if word.startswith("-") and word != "-":
            name = word.split("=")[0]
            if name not in options:
                return f"{' '.join(path)}: no option {name}"
            if name in takes_value and "=" not in word:
                j += 1  # its value
        else:
            positional += 1
        j += 1
    if positional > max_positional:
        return f"{' '.join(path)}: {positional} arguments given, it takes {max_positional}"
    return None


def _options(cmd) -> set[str]:  # type: ignore[no-untyped-def]
    names = {"--help"}
    for p in cmd.params:
        if p.param_type_name == "option":
            names.update(p.opts)
            names.update(p.secondary_opts)
    return names


def leaf_commands(group=None, prefix: tuple[str, ...] = ()) -> dict:  # type: ignore[no-untyped-def,type-arg]
    """Every visible command, by its path: ('node', 'evict') -> the command."""
    group = group or command_tree()
    out = {}
    for name in group.list_commands(typer.Context(group)):
        sub = _get(group, name)
        if sub is None or sub.hidden:
            continue
        if is_group(sub):
            out.update(leaf_commands(sub, (*prefix, name)))
        else:
            out[(*prefix, name)] = sub
    return out
