"""The layering contracts (pyproject.toml, checked by `lint-imports` in CI) hold only as far as
import-linter sees: an import made for types only (`if TYPE_CHECKING:`) must count, or a lower
layer can name a higher one's types unseen (caps did, four times, before issue #61)."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def importlinter() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]


def test_type_only_imports_count_against_the_contracts():
    assert importlinter().get("exclude_type_checking_imports") is False


def test_billing_sits_under_caps_and_over_storage():
    layers = next(
        c["layers"] for c in importlinter()["contracts"] if c["type"] == "layers" and "webhooks.caps" in c["layers"]
    )
    assert layers.index("webhooks.caps") < layers.index("webhooks.billing") < layers.index("webhooks.storage")
