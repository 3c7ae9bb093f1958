"""From a model's answer text to a program to run.

Rule (documented choice when there are several fenced blocks): take the last fenced block that
defines the task's entry point; if none does, the last fenced block; with no fence at all, the
whole text. A candidate that does not define the entry point is treated as a bare function body
and appended to the task prompt (HumanEval style); an indented body (a base model continuing the
prompt) ends at its first unindented line, as EvalPlus cuts base-model completions, so text the
model went on to write after the function is not run as module code. A candidate that does define it gets the
prompt's preamble (imports and helper functions before the entry point) put in front, because
answers routinely omit `from typing import List`.
"""

from __future__ import annotations

import re

_TOP_LEVEL = re.compile(r"\n(?=[^\s#])")  # a line that starts a new top-level statement
_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n(.*?)(?:```|\Z)", re.DOTALL)


def code_blocks(text: str) -> list[tuple[str, str]]:
    """(language tag, body) of every fenced block, in order."""
    return [(m.group(1).lower(), m.group(2)) for m in _FENCE.finditer(text)]


def extract_code(text: str, entry_point: str) -> str:
    blocks = [b for lang, b in code_blocks(text) if lang in ("", "python", "py", "python3")]
    if not blocks:
        return text.strip("\n") if "```" not in text else ""
    defining = [b for b in blocks if _defines(b, entry_point)]
    return (defining or blocks)[-1]


def _defines(code: str, entry_point: str) -> bool:
    return re.search(rf"^\s*(async\s+)?def\s+{re.escape(entry_point)}\s*\(", code, re.MULTILINE) is not None


def assemble(code: str, entry_point: str, prompt: str, preamble: str) -> str | None:
    """The program to run, or None when there is nothing to run."""
    if not code.strip():
        return None
    if _defines(code, entry_point):
        return preamble + "\n" + code if preamble.strip() else code
    if _defines(prompt, entry_point):  # a bare body: complete the prompt's signature with it
        if code.startswith((" ", "\t")):  # a continuation: the function ends at the first unindented line
            body = _TOP_LEVEL.split(code, maxsplit=1)[0] + "\n"
        else:
            body = "\n".join("    " + line for line in code.splitlines())
        return prompt + body
    return None
