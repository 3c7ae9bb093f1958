"""Showing text that came from outside (task ids, conditions, sessions, models, details, URLs):
the one helper every renderer uses, for the terminal and for Markdown.

A label is data, not instructions to the terminal: every control character (C0, DEL, C1, so
every ESC, CSI and OSC sequence, which all begin with one), and the bidirectional overrides that
reorder what a reader sees, is written as a visible escape (`\\x1b`, `\\n`, `\\u202e`); so is a
lone surrogate (a JSON `\\ud800` escape with no pair), which no UTF-8 terminal or file can take. Values of
credential-named environment variables (OPENAI_API_KEY, ...) are erased too, so a report never
prints a key a grader or an agent copied into a label or a detail. Markdown additionally gets its
punctuation backslash-escaped, so a label can neither break a table nor become a link or HTML.
"""

from __future__ import annotations

import re

from noisefloor.proxy.request import erasure, secrets

_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069\ud800-\udfff]")
_RAW_IN_JSON = re.compile("[\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]")  # JSON escapes C0
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
_MD = re.compile(r"([\\`*_{}\[\]<>()#+!|~&])")


def _escape(m: re.Match[str]) -> str:
    c = m.group()
    if c in _NAMED:
        return _NAMED[c]
    return f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}"


def counted(n: int, what: str) -> str:
    """"1 exchange", "2 exchanges": a count and its noun, for one-line messages."""
    return f"{n} {what}{'' if n == 1 else 's'}"


def visible(value: object) -> str:
    """`value` as text safe to print on a terminal: control characters escaped, secrets erased."""
    return _visible(value if isinstance(value, str) else str(value), secrets.environment_values())


def _visible(text: str, env: tuple[str, ...]) -> str:
    if env:
        text = erasure.erase(text, env)
    return _CONTROL.sub(_escape, text)


class Visible:
    """`visible` for a listing of many lines: the credential values are read once, and each distinct
    text is escaped once (a session's label repeats on every one of its exchanges), at most
    `limit` texts remembered. Same output as `visible`, never a skipped escape."""

    def __init__(self, limit: int = 1 << 16) -> None:
        self._env = secrets.environment_values()
        self._seen: dict[str, str] = {}
        self._limit = limit

    def __call__(self, value: object) -> str:
        if type(value) is not str:  # a number or None: str() first, and 1 and True must not share a slot
            return _visible(str(value), self._env)
        shown = self._seen.get(value)
        if shown is None:
            if len(self._seen) >= self._limit:
                self._seen.clear()
            shown = self._seen[value] = _visible(value, self._env)
        return shown


def visible_lines(text: str) -> str:
    """A block of several lines (a design's report section) made `visible` line by line."""
    return "\n".join(visible(line) for line in text.split("\n"))


def md_block(text: str) -> str:
    """A preformatted text block (a terminal table) as Markdown: an indented code block, in which
    nothing is markup, each line `visible`."""
    return "\n".join(f"    {visible(line)}" for line in text.split("\n"))


def md(value: object) -> str:
    """`value` as Markdown text: `visible`, then Markdown's punctuation escaped."""
    return _MD.sub(r"\\\1", visible(value))


def json_text(text: str) -> str:
    """JSON text (`json.dumps(..., ensure_ascii=False)`) safe to print: the characters JSON leaves
    raw but a terminal obeys (DEL, C1, bidi overrides) written as `\\u` escapes, so it stays JSON."""
    return _RAW_IN_JSON.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def json_line(data: bytes) -> bytes:
    """`json_text` on UTF-8 JSON bytes. Pure ASCII without DEL holds none of the characters it
    escapes, so such a line (most of them) is passed through without decoding."""
    if data.isascii() and b"\x7f" not in data:
        return data
    return json_text(data.decode("utf-8", "surrogateescape")).encode("utf-8", "surrogateescape")
