"""docs/api.md (the HTTP contract) and webhooks/web/openapi.yaml name the same routes.

A route is "METHOD path" with every path parameter written `{}`: the contract writes
`<lead_id>`, the description `{lead_id}`, and the two need not agree on the name. The contract
may name routes that are not built yet (NOT_BUILT) and the description may hold extensions,
which docs/api.md lists in its last section, "Extensions"; either list must be exact, so a
route that is built, dropped or renamed fails here until both files say so.
"""

from __future__ import annotations

import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
API_MD = ROOT / "docs" / "api.md"
OPENAPI = ROOT / "webhooks" / "web" / "openapi.yaml"

METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")
ROUTE = re.compile(r"\b(GET|POST|PUT|PATCH|DELETE) (/[^\s`?\[\]|]*)")
# A row of the "Operations" table that names a path without a method: a page, so GET.
BARE_ROW = re.compile(r"^\| `(/[^\s`?]*)` \|", re.MULTILINE)
# The console's pages, named without a method after "Pages:" in the contract: each is a GET.
CONSOLE_PAGES = re.compile(r"Pages: (.*)", re.DOTALL)
CONSOLE_PAGE = re.compile(r"`(/ops/[^\s`?]*)[^`]*`")
# Sections that quote other parties' APIs (the providers' listing endpoints), not ours.
OTHER_PARTIES = ("Provider reconciliation",)
# In the contract, not built yet: no view serves them and openapi.yaml does not describe them.
# (None today: docs/api.md copies a section of the contract once its routes are built.)
NOT_BUILT: set[str] = set()


def route(method: str, path: str) -> str:
    """'GET /v1/admin/leads/<lead_id>.' -> 'GET /v1/admin/leads/{}'."""
    path = re.sub(r"<[^>]+>|\{[^}]+\}", "{}", path.rstrip(".,;:)"))
    return f"{method} {path}"


def sections(text: str) -> list[tuple[str, str]]:
    """(heading, body) of each section of a Markdown text, headings of any level."""
    parts = re.split(r"^(#{1,6} .*)$", text, flags=re.MULTILINE)
    return [("", parts[0])] + list(zip(parts[1::2], parts[2::2], strict=True))


def named_routes(text: str) -> set[str]:
    found: set[str] = set()
    for heading, body in sections(text):
        if any(other in heading for other in OTHER_PARTIES):
            continue
        found |= {route(m[1], m[2]) for m in ROUTE.finditer(heading + "\n" + body)}
        found |= {route("GET", m[1]) for m in BARE_ROW.finditer(body)}
        pages = CONSOLE_PAGES.search(body)
        if pages:
            found |= {route("GET", m[1]) for m in CONSOLE_PAGE.finditer(pages[1])}
    return found


def contract_and_extensions() -> tuple[set[str], set[str]]:
    text = API_MD.read_text()
    head, sep, extensions = text.rpartition("\n## Extensions\n")
    assert sep, "docs/api.md ends with an 'Extensions' section"
    return named_routes(head), named_routes(extensions)


def described_routes() -> set[str]:
    spec = yaml.safe_load(OPENAPI.read_text())
    return {
        route(method.upper(), path)
        for path, item in spec["paths"].items()
        for method in item
        if method.upper() in METHODS
    }


def test_every_route_of_the_contract_is_described_or_listed_as_not_built() -> None:
    contract, _ = contract_and_extensions()
    assert contract - described_routes() == NOT_BUILT


def test_every_described_route_is_in_the_contract_or_its_extensions() -> None:
    contract, extensions = contract_and_extensions()
    assert described_routes() - contract == extensions


def test_an_extension_is_not_also_in_the_contract() -> None:
    contract, extensions = contract_and_extensions()
    assert not contract & extensions


def test_every_setting_has_a_row_in_docs_configuration() -> None:
    """Every variable webhooks/config.py reads is named in a row of docs/configuration.md."""
    read = set(re.findall(r'"([A-Z][A-Z0-9_]{3,})"', (ROOT / "webhooks" / "config.py").read_text()))
    rows = re.findall(r"^\|.*\|$", (ROOT / "docs" / "configuration.md").read_text(), re.MULTILINE)
    documented = {name for row in rows for name in re.findall(r"`([A-Z][A-Z0-9_]+)`", row)}
    assert len(read) > 40, "the pattern still finds config.py's settings"
    assert read - documented == set()
