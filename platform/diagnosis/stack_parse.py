"""Parsing py-spy (plain and --native) and faulthandler dumps into normalized frames.

Normalizing drops what differs between ranks at the same place in the code (line numbers, native
addresses, thread ids, pids, C++ template and argument lists) and keeps the function and the file
(or library) basename. Frames are innermost first, as both tools print them. Of all threads, the
one that matters is kept: the main thread (py-spy names it; with faulthandler it is the thread whose
outermost frame is a module), else the first thread in torch or user code.

Most ranks of a large job print identical lines, so lines are cached (process-wide, bounded) and
whole texts per call (`StackParser`): parsing 16,384 dumps costs little more than parsing the few
distinct ones.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

_PYSPY_THREAD = re.compile(r'^Thread (?:0x)?[0-9a-fA-F]+ \(([a-z+]+)\)(?::\s*"(.*)")?\s*$')
_FH_THREAD = re.compile(r"^(Current thread|Thread) 0x[0-9a-fA-F]+ \(most recent call first\):\s*$")
_FH_FRAME = re.compile(r'^\s+File "(.*)", line (\d+|\?+) in (.+?)\s*$')
_PY_LOC = re.compile(r"^(.*?):(\d+)$")
_HEX = re.compile(r"^0x[0-9a-fA-F]+$")
_NATIVE_NOISE_LIBS = ("libc.so", "libpthread", "ld-linux", "libstdc++", "libgcc_s")


@dataclass(frozen=True)
class Frame:
    function: str
    file: str  # basename of the Python file, or the native library
    native: bool
    text: str = ""  # "function (file)", rendered once per distinct line

    def render(self) -> str:
        return self.text or f"{self.function} ({self.file})"


def _frame(function: str, file: str, native: bool) -> Frame:
    return Frame(function=function, file=file, native=native, text=f"{function} ({file})")


@dataclass(frozen=True)
class ParsedStack:
    """The kept thread's frames, innermost first; `frames` are the Python ones (the signature)."""

    frames: tuple[str, ...]
    native: tuple[str, ...]
    all_frames: tuple[Frame, ...]
    threads: int
    fmt: str  # py-spy | faulthandler | unknown

    @property
    def empty(self) -> bool:
        return not self.all_frames


def _basename(path: str) -> str:
    return path.rsplit("/", 1)[-1]


def _strip_cpp(name: str) -> str:
    """'ns::f<T, U>(int)::{lambda()#1}::_FUN' -> 'ns::f::_FUN': templates and arguments out."""
    out: list[str] = []
    depth = 0
    for ch in name:
        if ch in "<(":
            depth += 1
        elif ch in ">)":
            depth = max(0, depth - 1)
        elif depth == 0:
            out.append(ch)
    text = "".join(out)
    text = re.sub(r"\{lambda#?\d*\}", "{lambda}", text)
    text = re.sub(r"\s+", " ", text).strip()
    return text or name[:80]


@lru_cache(maxsize=8_192)
def _pyspy_frame(line: str) -> Frame | None:
    """One py-spy frame line ('    func (file.py:12)' or '    func (libfoo.so)'); None for noise."""
    body = line.strip()
    if not body.endswith(")"):
        return None
    cut = body.rfind(" (")
    if cut <= 0:
        return None
    func, loc = body[:cut].strip(), body[cut + 2 : -1]
    m = _PY_LOC.match(loc)
    if m is not None and not loc.endswith(".so"):
        return _frame(func, _basename(m.group(1)), False)
    if _HEX.match(func):
        return None  # an unsymbolized native address
    lib = _basename(loc)
    if lib.startswith(_NATIVE_NOISE_LIBS) or lib.startswith("libpython"):
        return None  # the interpreter's and libc's own frames say nothing about where the rank is
    return _frame(_strip_cpp(func), re.sub(r"\.so(\.[\d.]+)?$", ".so", lib), True)


@lru_cache(maxsize=8_192)
def _fh_frame(line: str) -> Frame | None:
    m = _FH_FRAME.match(line)
    if m is None:
        return None
    return _frame(m.group(3), _basename(m.group(1)), False)


def _choose(threads: list[tuple[str, list[Frame]]], fmt: str) -> list[Frame]:
    """The main thread: py-spy names it; otherwise it is the thread not started by `threading`
    (whose outermost frame is threading's _bootstrap), the one running a module if several are."""
    if not threads:
        return []
    if fmt == "py-spy":
        for name, frames in threads:
            if name == "MainThread":
                return frames
    candidates = []
    for _name, frames in threads:
        py = [f for f in frames if not f.native]
        if py and not (py[-1].file == "threading.py" and py[-1].function.startswith("_bootstrap")):
            candidates.append(frames)
    if candidates:
        modules = [c for c in candidates if [f for f in c if not f.native][-1].function == "<module>"]
        return (modules or candidates)[0]
    return threads[0][1]


def _parse(text: str) -> ParsedStack:
    threads: list[tuple[str, list[Frame]]] = []
    fmt = "unknown"
    current: list[Frame] | None = None
    for line in text.splitlines():
        if not line.strip():
            continue
        if line[0] not in " \t":
            m = _PYSPY_THREAD.match(line)
            if m is not None:
                fmt = "py-spy"
                current = []
                threads.append((m.group(2) or "", current))
                continue
            m2 = _FH_THREAD.match(line)
            if m2 is not None:
                fmt = "faulthandler"
                current = []
                threads.append(("current" if m2.group(1).startswith("Current") else "", current))
                continue
            current = None  # a header or a stray log line
            continue
        if current is None:
            continue
        frame = _fh_frame(line) if fmt == "faulthandler" else _pyspy_frame(line)
        if frame is not None:
            current.append(frame)
    kept = _choose(threads, fmt)
    return ParsedStack(
        frames=tuple(f.text for f in kept if not f.native),
        native=tuple(f.text for f in kept if f.native),
        all_frames=tuple(kept),
        threads=len(threads),
        fmt=fmt,
    )


def parse_stack(text: str) -> ParsedStack:
    """The normalized frames of one dump."""
    return _parse(text)


class StackParser:
    """Parses many dumps, each distinct text once (a cache that lives as long as one diagnosis)."""

    def __init__(self) -> None:
        self._cache: dict[str, ParsedStack] = {}

    def parse(self, text: str) -> ParsedStack:
        hit = self._cache.get(text)
        if hit is None:
            hit = self._cache[text] = _parse(text)
        return hit
