"""Layering rules that import-linter cannot say, read from the source with
`ast` (nothing is imported), each a plain test of the default tier so that CI fails the day one
is broken.

Views call services: a view area (a package under webhooks/web, such as admin/ or ops/, or a
module there that defines a blueprint, such as leads.py) imports no other view area. What two
areas share is a service of the domain (leads/, payments/, ...) or plumbing of the HTTP face
that is no view itself (webhooks/web/http.py, listing.py), and that plumbing imports no view.

Packages do not loop: a package's __init__ never takes part in an import cycle with its own
modules (web/admin and web/ops did: the __init__ made the blueprint and imported its route
modules at the bottom, which imported the blueprint back), and it imports its own modules only
in its leading import block, never further down for their side effects. Each route module owns
its blueprint, as flaskr's auth.py and blog.py do, and the package nests them.

The layering contracts (pyproject.toml, checked by `lint-imports` in CI) hold only as far as
import-linter sees: an import made for types only (`if TYPE_CHECKING:`) must count, or a lower
layer can name a higher one's types unseen (caps did, four times, before issue #61).
"""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WEB = "webhooks.web"


def module_name(root: Path, path: Path) -> str:
    """The dotted name of the module at `path` (a package's __init__ names the package)."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported(root: Path, path: Path, node: ast.AST) -> set[str]:
    """The modules an import statement of `path` imports, by dotted name (relative imports
    resolved): for `from a import b`, `a.b` when b is a module of package a, else `a`."""
    if isinstance(node, ast.Import):
        return {alias.name for alias in node.names}
    if not isinstance(node, ast.ImportFrom):
        return set()
    package = module_name(root, path) if path.name == "__init__.py" else module_name(root, path).rpartition(".")[0]
    base = node.module or ""
    if node.level:
        anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
        base = ".".join([*anchor, base] if base else anchor)
    return {f"{base}.{alias.name}" if is_module(root, f"{base}.{alias.name}") else base for alias in node.names}


def imports(root: Path, path: Path) -> set[str]:
    """Every module `path` imports, anywhere in it (functions included)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return {name for node in ast.walk(tree) for name in imported(root, path, node)}


def is_module(root: Path, name: str) -> bool:
    """Whether `name` is a module or package of the tree at `root`."""
    path = root.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def defines_blueprint(path: Path) -> bool:
    """Whether the module makes a flask Blueprint (a call to `Blueprint(...)`)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return any(
        isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "Blueprint"
        for node in ast.walk(tree)
    )


def view_areas(root: Path) -> set[str]:
    """The view areas of the HTTP face: each package under webhooks/web, and each module directly
    in it that defines a blueprint."""
    web = root / "webhooks" / "web"
    packages = {f"{WEB}.{p.name}" for p in web.iterdir() if (p / "__init__.py").is_file()}
    modules = {f"{WEB}.{p.stem}" for p in web.glob("*.py") if p.name != "__init__.py" and defines_blueprint(p)}
    return packages | modules


def area_of(module: str, areas: set[str]) -> str | None:
    return next((a for a in areas if module == a or module.startswith(a + ".")), None)


def view_import_violations(root: Path) -> list[str]:
    """`path: imports module` for each import of a view area by a module of another area (or
    by the HTTP face's plumbing, which belongs to no area)."""
    areas = view_areas(root)
    found = []
    for path in sorted((root / "webhooks" / "web").rglob("*.py")):
        own = area_of(module_name(root, path), areas)
        for name in sorted(imports(root, path)):
            other = area_of(name, areas)
            if other is not None and other != own:
                found.append(f"{path.relative_to(root)}: imports {name}")
    return found


def test_no_view_imports_another_view_area():
    found = view_import_violations(ROOT)
    assert not found, (
        "a view imports another view area; move what both need into a service of the domain "
        "(leads/, payments/, ...) or, for HTTP plumbing, a module of webhooks/web that is no view:\n" + "\n".join(found)
    )


def test_the_view_check_sees_each_way_of_importing(tmp_path):
    web = tmp_path / "webhooks" / "web"
    for folder in (web / "admin", web / "ops"):
        folder.mkdir(parents=True)
        (folder / "__init__.py").write_text("")
    (tmp_path / "webhooks" / "__init__.py").write_text("")
    (web / "__init__.py").write_text("")
    (web / "http.py").write_text("def query_arg(): ...\n")
    (web / "leads.py").write_text("from flask import Blueprint\nbp = Blueprint('leads', __name__)\n")
    (web / "admin" / "buyers.py").write_text("from webhooks.web.http import query_arg\nfrom . import lists\n")
    (web / "ops" / "a.py").write_text("from webhooks.web.admin import buyers\n")
    (web / "ops" / "b.py").write_text("import webhooks.web.admin.buyers\n")
    (web / "ops" / "c.py").write_text("from ..admin.buyers import save\n")
    (web / "ops" / "d.py").write_text("def f():\n    from webhooks.web import leads\n")
    (web / "http.py").write_text("from webhooks.web.ops import a\n")
    assert view_import_violations(tmp_path) == [
        "webhooks/web/http.py: imports webhooks.web.ops.a",
        "webhooks/web/ops/a.py: imports webhooks.web.admin.buyers",
        "webhooks/web/ops/b.py: imports webhooks.web.admin.buyers",
        "webhooks/web/ops/c.py: imports webhooks.web.admin.buyers",
        "webhooks/web/ops/d.py: imports webhooks.web.leads",
    ]


def packages(root: Path) -> list[Path]:
    return sorted(p for top in ("webhooks", "workers") for p in (root / top).rglob("__init__.py"))


def package_loops(root: Path) -> list[str]:
    """`package: cycle` for each package whose __init__ is on an import cycle with its own
    modules (an import of the package itself, `from pkg import name` of a name its __init__
    defines, is what closes one)."""
    found = []
    for init in packages(root):
        package = module_name(root, init)
        modules = {module_name(root, p): p for p in init.parent.rglob("*.py")}
        edges = {name: {_within(i, modules) for i in imports(root, path)} for name, path in modules.items()}
        cycle = _path_back(edges, package, [package], set())
        if cycle:
            found.append(f"{package}: " + " -> ".join(cycle))
    return found


def _within(name: str, modules: dict[str, Path]) -> str | None:
    """The module of `modules` that `name` is, or is in (None: outside them all)."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def _path_back(edges: dict[str, set[str | None]], package: str, path: list[str], seen: set[str]) -> list[str] | None:
    """A path of imports from the end of `path` back to `package` through modules not `seen`
    yet (each is followed once: a second way to it finds nothing new), if any."""
    for nxt in sorted(n for n in edges[path[-1]] if n is not None):
        if nxt == package and len(path) > 1:
            return [*path, package]
        if nxt != package and nxt not in seen:
            seen.add(nxt)
            found = _path_back(edges, package, [*path, nxt], seen)
            if found:
                return found
    return None


def late_own_imports(root: Path) -> list[str]:
    """`path:line imports module` for each import of a package's own module by its __init__
    after the leading import block (the docstring aside)."""
    found = []
    for init in packages(root):
        package = module_name(root, init)
        body = ast.parse(init.read_text(encoding="utf-8")).body
        if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
            body = body[1:]
        lead = next((i for i, node in enumerate(body) if not isinstance(node, (ast.Import, ast.ImportFrom))), len(body))
        for node in body[lead:]:
            for name in sorted(_module_level_imports(root, init, node)):
                if name.startswith(package + "."):
                    found.append(f"{init.relative_to(root)}:{node.lineno} imports {name}")
    return found


def _module_level_imports(root: Path, path: Path, node: ast.AST) -> set[str]:
    """What `node`, a statement of a module's body, imports when the module runs: its own
    imports and those of blocks (if, try, with), not those in function or class bodies."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return set()
    found = imported(root, path, node)
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.stmt):
            found |= _module_level_imports(root, path, child)
    return found


def test_no_package_loops_through_its_init():
    found = package_loops(ROOT)
    assert not found, (
        "a package's __init__ is on an import cycle with its own modules; let each module own "
        "what it declares (a route module its blueprint) and the __init__ only gather them:\n" + "\n".join(found)
    )


def test_no_package_imports_its_own_modules_below_its_imports():
    found = late_own_imports(ROOT)
    assert not found, (
        "a package's __init__ imports its own modules after other code, for their side effects; "
        "import them in the leading import block and use them by name:\n" + "\n".join(found)
    )


def test_the_package_checks_see_a_loop_and_a_late_import(tmp_path):
    pkg = tmp_path / "webhooks" / "web" / "area"
    pkg.mkdir(parents=True)
    (tmp_path / "webhooks" / "__init__.py").write_text("")
    (tmp_path / "webhooks" / "web" / "__init__.py").write_text("")
    (tmp_path / "workers").mkdir()
    (pkg / "__init__.py").write_text(
        '"""Doc."""\nimport json\nbp = object()\nfrom webhooks.web.area import routes  # noqa\n'
    )
    (pkg / "routes.py").write_text("from webhooks.web.area import helpers\n")
    (pkg / "helpers.py").write_text("from webhooks.web.area import bp\n")
    area = "webhooks.web.area"
    assert package_loops(tmp_path) == [f"{area}: {area} -> {area}.routes -> {area}.helpers -> {area}"]
    assert late_own_imports(tmp_path) == ["webhooks/web/area/__init__.py:4 imports webhooks.web.area.routes"]
    (pkg / "__init__.py").write_text(
        '"""Doc."""\nfrom webhooks.web.area import routes\n\n\ndef f():\n    from . import helpers\n'
    )
    (pkg / "helpers.py").write_text("X = 1\n")
    assert package_loops(tmp_path) == [] and late_own_imports(tmp_path) == []


def importlinter() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]


def test_type_only_imports_count_against_the_contracts():
    assert importlinter().get("exclude_type_checking_imports") is False


def test_billing_sits_under_caps_and_over_storage():
    layers = next(
        c["layers"] for c in importlinter()["contracts"] if c["type"] == "layers" and "webhooks.caps" in c["layers"]
    )
    assert layers.index("webhooks.caps") < layers.index("webhooks.billing") < layers.index("webhooks.storage")
