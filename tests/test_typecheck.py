"""tools/typecheck.py's layout: the package as it installs (pyproject's package-dir), so mypy
checks the modules under the names they are imported by, and reports them at repository paths."""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import tomllib
from pathlib import Path

from tests.conftest import ROOT

_spec = importlib.util.spec_from_file_location("typecheck", ROOT / "tools" / "typecheck.py")
typecheck = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(typecheck)


def test_the_layout_holds_every_installed_package_at_the_file_the_import_finds(tmp_path: Path):
    top = typecheck.build_layout(typecheck.package_dirs(ROOT / "pyproject.toml"), tmp_path)
    packages = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    assert len(packages) > 5
    for name in packages:
        init = tmp_path.joinpath(*name.split(".")) / "__init__.py"
        imported = importlib.import_module(name).__file__
        assert os.path.realpath(init) == os.path.realpath(imported), name
    assert (top / "pytest_plugin.py").is_symlink() and not (top / "__pycache__").exists()


def test_a_message_is_reported_at_its_path_in_the_repository(tmp_path: Path):
    typecheck.build_layout(typecheck.package_dirs(ROOT / "pyproject.toml"), tmp_path)
    msg = json.loads('{"file": "noisefloor/proxy/request/keys.py", "line": 3, "column": 4, "message": "m", '
                     '"hint": null, "code": "arg-type", "severity": "error"}')
    assert typecheck.report(msg, tmp_path) == "proxy/request/keys.py:3:5: error: m  [arg-type]"
    msg.update(file="noisefloor/bounded.py", code=None, severity="note", hint="h")
    assert typecheck.report(msg, tmp_path) == "src/noisefloor/bounded.py:3:5: note: m\n" \
                                              "src/noisefloor/bounded.py:3:5: note: h"
