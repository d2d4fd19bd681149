"""Standards of the tree that hold only while a check holds them (issue #61): each is a plain
test of the default tier, so that CI fails the build the day one is broken.

Rooms: no package of the product holds more than 14 modules (a folder past that wants splitting
by concept, docs/architecture.md shows the rooms).

Line budgets: the tools beside the product stay small next to it. Lines are counted as the
issue counts them, `wc -l` of every *.py under the folder (newline characters, blank lines and
comments included, sub-folders too: `find bench -name '*.py' | xargs wc -l`).
"""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

BUDGETS = {  # folder: most lines of Python it may hold
    "bench": 4_000,
    "soak": 2_000,
}


def python_lines(folder: Path) -> dict[str, int]:
    """`wc -l` of each *.py under `folder` (newline characters), by path within it."""
    return {str(p.relative_to(folder)): p.read_bytes().count(b"\n") for p in sorted(folder.rglob("*.py"))}


@pytest.mark.parametrize("folder", sorted(BUDGETS))
def test_folder_stays_within_its_line_budget(folder):
    counted = python_lines(ROOT / folder)
    total = sum(counted.values())
    largest = sorted(counted.items(), key=lambda item: -item[1])[:5]
    assert total <= BUDGETS[folder], (
        f"{folder}/ holds {total} lines of Python, over its budget of {BUDGETS[folder]}: move a "
        f"one-off bench to text in bench/history or merge what repeats. Largest: {largest}"
    )


def test_lines_are_counted_as_wc_does(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "a.py").write_bytes(b"x = 1\n\n# note\n")
    (tmp_path / "sub" / "b.py").write_bytes(b"y = 2")  # no newline at the end: wc -l says 0
    (tmp_path / "notes.md").write_bytes(b"not\ncounted\n")
    assert python_lines(tmp_path) == {"a.py": 3, "sub/b.py": 0}


# Rooms: a package holds at most this many modules (`.py` files directly in its folder,
# `__init__.py` included; sub-packages are rooms of their own). Past it, split by concept.
MOST_MODULES = 14
CODE = ("webhooks", "workers")


def crowded_packages(roots: list[Path], most: int = MOST_MODULES) -> dict[str, int]:
    """{folder: number of modules} of every folder under `roots` holding more than `most`."""
    counts = {}
    for root in roots:
        for folder in sorted({root, *(p for p in root.rglob("*") if p.is_dir())}):
            if folder.name == "__pycache__":
                continue
            n = sum(1 for p in folder.glob("*.py"))
            if n > most:
                counts[str(folder.relative_to(root.parent))] = n
    return counts


def test_no_package_holds_more_than_14_modules():
    crowded = crowded_packages([ROOT / name for name in CODE])
    assert not crowded, (
        f"packages over {MOST_MODULES} modules: {crowded}; split each by concept (a sub-package "
        "for what belongs together), as docs/architecture.md's map shows"
    )


def test_modules_are_counted_per_folder(tmp_path):
    root = tmp_path / "pkg"
    (root / "sub").mkdir(parents=True)
    for i in range(3):
        (root / f"m{i}.py").write_text("")
        (root / "sub" / f"s{i}.py").write_text("")
    (root / "notes.md").write_text("")
    assert crowded_packages([root], most=3) == {}
    (root / "__init__.py").write_text("")
    assert crowded_packages([root], most=3) == {"pkg": 4}
