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


def test_every_error_a_user_sees_derives_from_the_one_root():
    """One `except NoisefloorError` catches whatever a command can say went wrong; an exception
    deriving straight from a built-in is control flow private to its module (`_`-named)."""
    roots = structure.exception_roots(ROOT)
    assert not roots, f"derive these from noisefloor.errors (or name them _private): {roots}"


def test_the_checker_finds_a_second_exception_root(tmp_path):
    import subprocess

    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "m.py").write_text("class Bad(ValueError):\n    pass\n\n\nclass _Flow(Exception):\n"
                                           "    pass\n\n\nclass Good(InputError, KeyError):\n    pass\n")
    assert structure.exception_roots(tmp_path) == ["pkg/m.py Bad"]


FORMAT_HOMES = {"proxy/store/env.py", "proxy/store/migrate.py"}  # the format's declaration, its migration


def test_store_formats_are_named_by_their_declaration_and_migration_only():
    """The runtime knows one store format; only its declaration and the migration name any."""
    naming = {str(p.relative_to(ROOT)) for p in structure.sources(ROOT) if "noisefloor-log/" in p.read_text()}
    assert naming <= FORMAT_HOMES, f"store formats named outside their two homes: {sorted(naming - FORMAT_HOMES)}"


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


def _is_module(parts: list[str], root: Path = ROOT) -> bool:
    """Whether an installed name (`noisefloor.proxy.store._codec`) is a module or package, not a
    name inside a module. The root's own modules live in src/noisefloor, its parts at the top."""
    rest = parts[1:]
    base = root / "src" / "noisefloor" if (root / "src" / "noisefloor" / f"{rest[0]}.py").exists() else root
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


def test_the_store_is_composed_of_parts_not_mixins():
    """`Store` holds its parts (`store.tables`, `store.bodies`, ...) as objects: a class with bases
    would share private state across modules again, and no store file could be read on its own."""
    tree = ast.parse((ROOT / "proxy" / "store" / "log.py").read_text(encoding="utf-8"))
    store = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Store")
    assert not store.bases, f"Store derives from {[ast.unparse(b) for b in store.bases]}: compose a part instead"


# `x._name` where x is not self or cls, allowed: the public API of namedtuples (`_replace`,
# `_asdict`, `_fields`, `_make`), the standard library's documented `sys._getframe` and `os._exit`
# (a forked worker ends without running its parent's cleanups), and mitmproxy's loop exception
# handler, which `Master.run` installs and offers no public hook for
PRIVATE_ALLOWED = {"_replace", "_asdict", "_fields", "_make", "sys._getframe", "os._exit",
                   "master._asyncio_exception_handler"}


def private_reaches(root: Path) -> list[str]:
    """Each `x._name` in proxy/ and src/ where x is not self or cls, and each `from m import _name`
    that is not a module: another object's or module's private name."""
    found = []
    for path in sorted([*(root / "proxy").rglob("*.py"), *(root / "src").rglob("*.py")]):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("noisefloor."):
                found += [f"{path.relative_to(root)}:{node.lineno} {node.module}.{a.name}" for a in node.names
                          if a.name.startswith("_") and not a.name.startswith("__")
                          and not _is_module([*node.module.split("."), a.name], root)]
            if not (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")):
                continue
            owner = node.value.id if isinstance(node.value, ast.Name) else None
            if owner in ("self", "cls") or node.attr in PRIVATE_ALLOWED or f"{owner}.{node.attr}" in PRIVATE_ALLOWED:
                continue
            found.append(f"{path.relative_to(root)}:{node.lineno} {ast.unparse(node)}")
    return found


def test_no_module_reaches_into_another_objects_private_names():
    found = private_reaches(ROOT)
    assert not found, "private names used from outside their object (make them public, or a method):\n  " + \
        "\n  ".join(found)


def test_the_private_name_check_finds_a_reach(tmp_path):
    (tmp_path / "proxy").mkdir()
    (tmp_path / "src").mkdir()
    (tmp_path / "proxy" / "_own.py").write_text("")
    (tmp_path / "proxy" / "m.py").write_text("from noisefloor.proxy import _own\nfrom noisefloor.proxy.m import _f\n"
                                            "def f(store, t):\n    self = store\n    return store._env, self._ok, "
                                            "t._replace(a=1), os._exit\n")
    assert private_reaches(tmp_path) == ["proxy/m.py:2 noisefloor.proxy.m._f", "proxy/m.py:5 store._env"]
