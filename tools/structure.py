"""The package's size limits, checked: no function over 60 lines, no cli.py over 250 lines
(tests/, bench/ and tools/ are exempt). `python3 tools/structure.py` lists the offenders;
tests/test_structure.py fails on any."""

from __future__ import annotations

import ast
import builtins
import subprocess
import sys
from pathlib import Path

MAX_FUNCTION_LINES = 60
MAX_CLI_LINES = 250
EXEMPT = ("tests/", "bench/", "tools/")


def sources(root: Path) -> list[Path]:
    """The repository's tracked and new Python files outside the exempt folders."""
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "*.py"], cwd=root,
                            capture_output=True, text=True, check=True).stdout.split()
    return [root / f for f in sorted(set(listed)) if not f.startswith(EXEMPT) and (root / f).is_file()]


def long_functions(root: Path) -> list[str]:
    """'path:line name (N lines)' for every function or method longer than the limit, longest first
    (`offender` gives the part without the line and count)."""
    found = []
    for path in sources(root):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                n = node.end_lineno - node.lineno + 1  # decorators not counted, as they declare, not do
                if n > MAX_FUNCTION_LINES:
                    found.append((n, f"{path.relative_to(root)}:{node.lineno} {node.name} ({n} lines)"))
    return [text for _, text in sorted(found, reverse=True)]


def long_clis(root: Path) -> list[str]:
    """'path (N lines)' for every cli.py longer than the limit."""
    out = []
    for path in sources(root):
        if path.name == "cli.py":
            n = len(path.read_text(encoding="utf-8").splitlines())
            if n > MAX_CLI_LINES:
                out.append(f"{path.relative_to(root)} ({n} lines)")
    return out


_BUILTIN_ERRORS = {n for n, v in vars(builtins).items() if isinstance(v, type) and issubclass(v, BaseException)}
ROOT_ERROR = "src/noisefloor/errors.py NoisefloorError"


def exception_roots(root: Path) -> list[str]:
    """'path name' for every public exception class whose bases are all built-in exceptions: a
    root of its own beside `NoisefloorError` (a class private to its module is control flow)."""
    out = []
    for path in sources(root):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_") and node.bases:
                if all(isinstance(b, ast.Name) and b.id in _BUILTIN_ERRORS for b in node.bases):
                    out.append(f"{path.relative_to(root)} {node.name}")
    return [o for o in out if o != ROOT_ERROR]


def offender(text: str) -> str:
    """'path name' of a long function, 'path' of a long cli.py: what stays put while lines move."""
    head = text.rsplit(" (", 1)[0]
    path, _, name = head.partition(" ")
    return f"{path.split(':')[0]} {name}".strip()


def main() -> int:
    root = Path(__file__).resolve().parent.parent
    offenders = long_functions(root) + long_clis(root)
    print("\n".join(offenders) or "within the limits")
    return 1 if offenders else 0


if __name__ == "__main__":
    sys.exit(main())
