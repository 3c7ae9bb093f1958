"""Type-check the package with mypy under the names it installs as: `noisefloor.proxy` from proxy/, etc.

pyproject's package-dir maps the repository's top-level folders onto `noisefloor.*`, and the editable
install does that with an import hook mypy cannot follow. So this lays the installed layout out as a
tree of symlinks (src/noisefloor's files, plus one link per mapped folder), runs mypy on it with
pyproject's [tool.mypy], and prints every message at its path in the repository. The exit status is
mypy's: 0 clean, 1 type errors, 2 mypy itself failed.

    .venv/bin/python tools/typecheck.py      # the mypy of the test extra, in the environment CI tests
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "noisefloor"
# mypy's incremental cache, and beside it the layout: a fixed place keeps the cache valid between runs
CACHE = ROOT / ".mypy_cache"
LAYOUT = CACHE / "layout"


def package_dirs(pyproject: Path) -> dict[str, Path]:
    """pyproject's package-dir: {dotted package: its folder in the repository}."""
    setuptools = tomllib.loads(pyproject.read_text(encoding="utf-8"))["tool"]["setuptools"]
    return {name: ROOT / folder for name, folder in setuptools["package-dir"].items()}


def build_layout(dirs: dict[str, Path], into: Path) -> Path:
    """The installed tree under `into`: the root package's entries linked one by one, each
    subpackage mapped elsewhere linked as a whole. Returns the root package's folder."""
    if into.exists():
        shutil.rmtree(into)
    top = into / PACKAGE
    top.mkdir(parents=True)
    for entry in dirs[PACKAGE].iterdir():
        if entry.name != "__pycache__":
            (top / entry.name).symlink_to(entry)
    for name, folder in dirs.items():
        if name != PACKAGE:
            link = into.joinpath(*name.split("."))
            if link.is_symlink() or link.exists():
                sys.exit(f"typecheck: {name} is mapped to {folder} but already lies in {dirs[PACKAGE]}")
            link.symlink_to(folder)
    return top


def repo_path(reported: str, cwd: Path) -> str:
    """A file as mypy named it inside the layout, as a path in the repository."""
    real = Path(os.path.realpath(cwd / reported))
    return str(real.relative_to(ROOT)) if real.is_relative_to(ROOT) else reported


def report(msg: dict[str, Any], cwd: Path) -> str:
    """One message of mypy's JSON output in its usual `path:line:col: severity: message  [code]` form."""
    where = f"{repo_path(msg['file'], cwd)}:{msg['line']}:{msg['column'] + 1}"
    code = f"  [{msg['code']}]" if msg.get("code") else ""
    text = f"{where}: {msg['severity']}: {msg['message']}{code}"
    return text + (f"\n{where}: note: {msg['hint']}" if msg.get("hint") else "")


def main() -> int:
    top = build_layout(package_dirs(ROOT / "pyproject.toml"), LAYOUT)
    run = subprocess.run([sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"),
                          "--cache-dir", str(CACHE), "--output", "json", top.name],
                         cwd=LAYOUT, capture_output=True, text=True)
    messages = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    for msg in messages:
        print(report(msg, LAYOUT))
    if run.returncode not in (0, 1) or run.stderr.strip():
        print(run.stderr.strip() or f"typecheck: mypy exited with {run.returncode}", file=sys.stderr)
        return run.returncode or 2
    errors = [msg for msg in messages if msg["severity"] == "error"]
    files = {msg["file"] for msg in errors}
    plural = {1: ""}
    print(f"typecheck: {len(errors)} error{plural.get(len(errors), 's')} in {len(files)} "
          f"file{plural.get(len(files), 's')}" if errors else "typecheck: no type errors")
    return run.returncode


if __name__ == "__main__":
    sys.exit(main())
