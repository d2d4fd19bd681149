"""Layering rules of the HTTP face that import-linter cannot say, read from the source with
`ast` (nothing is imported), each a plain test of the default tier so that CI fails the day one
is broken.

Views call services: a view area (a package under webhooks/web, such as admin/ or ops/, or a
module there that defines a blueprint, such as leads.py) imports no other view area. What two
areas share is a service of the domain (leads/, payments/, ...) or plumbing of the HTTP face
that is no view itself (webhooks/web/http.py, listing.py), and that plumbing imports no view.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WEB = "webhooks.web"


def module_name(root: Path, path: Path) -> str:
    """The dotted name of the module at `path` (a package's __init__ names the package)."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports(root: Path, path: Path) -> set[str]:
    """Every module `path` imports, anywhere in it, by dotted name (relative imports resolved):
    for `from a import b`, `a.b` when b is a module of package a, else `a`."""
    package = module_name(root, path) if path.name == "__init__.py" else module_name(root, path).rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                found.add(f"{base}.{alias.name}" if is_module(root, f"{base}.{alias.name}") else base)
    return found


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
