"""The multi-process tier's order: its longest test (the one-minute soak, about two minutes in
all) first, so that on two xdist workers (.ci/run) it runs beside the others, not after them."""

from __future__ import annotations

import pytest

FIRST = ("tests/e2e/test_soak.py::",)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=lambda item: not item.nodeid.startswith(FIRST))  # stable: the rest keep their order
