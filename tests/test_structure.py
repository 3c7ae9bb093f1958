"""The size limits every module keeps (tools/structure.py): no function over 60 lines, no cli.py
over 250 lines, outside tests/, bench/ and tools/."""

from __future__ import annotations

import ast
import importlib.util
import re
from pathlib import Path

from tests.conftest import ROOT

_spec = importlib.util.spec_from_file_location("structure", ROOT / "tools" / "structure.py")
structure = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(structure)

# Offenders allowed while their module is being split ('path name' or 'path'; none today): an
# entry goes when its module is split, and the test says so once it is within the limits.
KNOWN: set[str] = set()


def test_no_function_over_60_lines_and_no_cli_over_250():
    found = structure.long_functions(ROOT) + structure.long_clis(ROOT)
    new = [f for f in found if structure.offender(f) not in KNOWN]
    assert not new, "over the size limits (split along the jobs):\n  " + "\n  ".join(new)
    fixed = KNOWN - {structure.offender(f) for f in found}
    assert not fixed, f"within the limits now: remove {sorted(fixed)} from KNOWN in tests/test_structure.py"


def test_the_checker_finds_a_long_function_and_a_long_cli(tmp_path):
    import subprocess

    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    (tmp_path / "pkg").mkdir()
    body = "\n".join(f"    x{i} = {i}" for i in range(60))
    (tmp_path / "pkg" / "cli.py").write_text(f"def short():\n    pass\n\n\ndef long():\n{body}\n" + "#\n" * 200)
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_x.py").write_text(f"def long():\n{body}\n")  # exempt
    assert structure.long_functions(tmp_path) == ["pkg/cli.py:5 long (61 lines)"]
    assert structure.long_clis(tmp_path) == ["pkg/cli.py (265 lines)"]
    assert structure.offender("pkg/cli.py:5 long (61 lines)") == "pkg/cli.py long"
    assert structure.offender("pkg/cli.py (265 lines)") == "pkg/cli.py"


PROXY_TOP_LIMIT = 12
SUBPACKAGE_LIMIT = 15


def _packages(root: Path) -> list[Path]:
    return sorted(p.parent for p in root.rglob("__init__.py") if "__pycache__" not in p.parts)


def test_proxy_is_packages_by_job_within_their_limits():
    """A newcomer holds proxy/ in their head by its packages: few modules at its top, none of its
    packages grown past what one reads in a sitting."""
    proxy = ROOT / "proxy"
    top = [f.name for f in proxy.glob("*.py") if f.name != "__init__.py"]
    assert len(top) <= PROXY_TOP_LIMIT, f"proxy/ holds {len(top)} modules: {sorted(top)}"
    for pkg in _packages(proxy):
        modules = [f.name for f in pkg.glob("*.py") if f.name not in ("__init__.py", "__main__.py")]
        assert len(modules) <= SUBPACKAGE_LIMIT, f"{pkg.relative_to(ROOT)} holds {len(modules)} modules"


def test_each_package_lists_its_public_names_once():
    """`__all__` in each proxy package names exactly its public modules and subpackages (those not
    starting with `_`), so the public surface is read in one place."""
    for pkg in _packages(ROOT / "proxy"):
        tree = ast.parse((pkg / "__init__.py").read_text())
        assert ast.get_docstring(tree), f"{pkg.relative_to(ROOT)}/__init__.py says nothing of what the package is"
        listed = next((ast.literal_eval(n.value) for n in tree.body if isinstance(n, ast.Assign)
                       and any(getattr(t, "id", "") == "__all__" for t in n.targets)), None)
        if pkg.name == "cli" or pkg.name == "providers":
            continue  # façades of names (main; the provider registry), not of modules
        public = {f.stem for f in pkg.glob("*.py") if not f.stem.startswith("_")}
        public |= {d.name for d in pkg.iterdir() if (d / "__init__.py").exists()}
        assert listed is not None and sorted(listed) == sorted(public), f"{pkg.relative_to(ROOT)}: __all__ {listed}"


def test_no_module_imports_another_packages_private_module():
    """A `_`-named module is its package's own: code elsewhere goes through the package's public
    modules (tests may look inside)."""
    offenders = []
    for path in structure.sources(ROOT):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("noisefloor."):
                targets = [node.module + "." + a.name for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names if a.name.startswith("noisefloor.")]
            else:
                continue
            for target in targets:
                parts = target.split(".")
                private = [i for i, part in enumerate(parts) if part.startswith("_") and not part.startswith("__")
                           and _is_module(parts[:i + 1])]
                if not private:
                    continue
                owner = ".".join(parts[:private[0]]) + "."
                if not _dotted(path).startswith(owner):
                    offenders.append(f"{path.relative_to(ROOT)} imports {target}")
    assert not offenders, offenders


def _is_module(parts: list[str]) -> bool:
    """Whether an installed name (`noisefloor.proxy.store._codec`) is a module or package, not a
    name inside a module. The root's own modules live in src/noisefloor, its parts at the top."""
    rest = parts[1:]
    base = ROOT / "src" / "noisefloor" if (ROOT / "src" / "noisefloor" / f"{rest[0]}.py").exists() else ROOT
    folder = base.joinpath(*rest)
    return folder.with_suffix(".py").exists() or (folder / "__init__.py").exists()


def _dotted(path: Path) -> str:
    """The installed name of a repository file (proxy/store/log.py -> noisefloor.proxy.store.log)."""
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(("noisefloor", *parts[2:]) if parts[:2] == ("src", "noisefloor") else ("noisefloor", *parts))


INSTALLERS = ("pip install", "uv tool install", "pipx install", "uv pip install")


def test_every_install_line_in_readme_and_docs_carries_the_constraints():
    """An install line without constraints.txt lets pip backtrack (through 21 boto3 versions once);
    with it every line resolves at once (measured: BENCHMARKS.md, "Install lines")."""
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    bare = [f"{p.name}: {line.strip()}" for p in pages for line in p.read_text().splitlines()
            if any(i in line for i in INSTALLERS) and "constraints.txt" not in line]
    assert not bare, "install lines without -c constraints.txt:\n  " + "\n  ".join(bare)


PARTS = ("src/noisefloor", "proxy", "verifier", "analyzer", "ladder", "viewer")
README_LINES = 250


def test_readme_is_a_front_page_whose_layout_is_the_package_map():
    """README fits a screenful of scrolling: the walk and the package map; the module map and the
    reference live in docs/ (every page README links exists)."""
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= README_LINES, f"README.md has {len(readme.splitlines())} lines"
    layout = readme[readme.index("\n## Layout"):]
    layout = layout[:layout.find("\n## ", 1)] if "\n## " in layout[1:] else layout
    assert all(f"`{part}/`" in layout for part in PARTS), layout
    assert not any(f"`{f.name}`" in layout for part in PARTS for f in (ROOT / part).glob("*.py")
                   if f.name != "__init__.py"), "README's layout names modules: they belong in docs/development.md"
    linked = {m.group(1) for m in re.finditer(r"\]\((docs/[^)#]+)", readme)}
    assert linked and all((ROOT / p).exists() for p in linked), sorted(p for p in linked if not (ROOT / p).exists())


def test_the_module_map_in_docs_names_every_module():
    """docs/development.md is where a newcomer looks for a module's home: a module it does not name
    is one they cannot find (proxy/ by its subpackages)."""
    text = (ROOT / "docs" / "development.md").read_text()
    where = text[text.index("## Where each module lives"):]
    unnamed = [str(f.relative_to(ROOT)) for part in PARTS if part != "proxy" for f in sorted((ROOT / part).rglob("*.py"))
               if f.name != "__init__.py" and "__pycache__" not in f.parts and f"`{f.name}`" not in where]
    unnamed += [str(p.relative_to(ROOT)) for p in sorted((ROOT / "proxy").iterdir())
                if (p / "__init__.py").exists() and f"`{p.name}/`" not in where]
    assert not unnamed, f"docs/development.md's module map does not name: {unnamed}"
