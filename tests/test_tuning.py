"""The tuned tables (reference_kernels/tuning/): each says why beside it, each limit table can be
read at every N, and no kernel module keeps one of its own."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

KERNELS = Path(__file__).resolve().parents[1] / "reference_kernels"
TUNING = sorted(p.stem for p in (KERNELS / "tuning").glob("*.py") if p.stem != "__init__")


def _assignments(path: Path) -> list[tuple[str, int, int]]:
    """(name, first line, last line) of each top-level assignment, 1-based."""
    out = []
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign | ast.AnnAssign):
            target = node.targets[0] if isinstance(node, ast.Assign) else node.target
            if isinstance(target, ast.Name):
                out.append((target.id, node.lineno, node.end_lineno))
    return out


def _is_limit_table(value: object) -> bool:
    return (
        isinstance(value, tuple)
        and len(value) > 0
        and all(isinstance(r, tuple) and len(r) == 2 and (r[0] is None or isinstance(r[0], int)) for r in value)
    )


@pytest.mark.parametrize("module", TUNING)
def test_every_table_says_why(module: str) -> None:
    """A comment above it, on its line, or above the group of tables it belongs to (a 16-bit
    table and its 32-bit twin, written one after the other)."""
    path = KERNELS / "tuning" / f"{module}.py"
    lines = path.read_text().splitlines()
    said = False
    silent = []
    for name, first, last in _assignments(path):
        above = lines[first - 2].strip() if first > 1 else ""
        follows = above and not above.startswith("#") and said  # right after a table that said why
        said = above.startswith("#") or "#" in lines[first - 1] or "#" in lines[last - 1] or bool(follows)
        if not said:
            silent.append(name)
    assert not silent, f"tuning/{module}.py: no reason given for {silent}"


@pytest.mark.parametrize("module", TUNING)
def test_limit_tables_end_open_and_ascend(module: str) -> None:
    """`pick` reads the first row whose limit is >= N: the limits must rise and the last be
    None, or some N has no row."""
    mod = importlib.import_module(f"reference_kernels.tuning.{module}")
    tables = {k: v for k, v in vars(mod).items() if k.isupper() and _is_limit_table(v)}
    assert tables or module == "__init__"
    for name, table in tables.items():
        limits = [r[0] for r in table]
        assert limits[-1] is None, f"{module}.{name} does not end with a None row"
        assert limits[:-1] == sorted(set(limits[:-1])), f"{module}.{name}: limits do not rise"


@pytest.mark.parametrize("path", sorted(KERNELS.glob("*.py")), ids=lambda p: p.stem)
def test_kernel_modules_keep_no_limit_table(path: Path) -> None:
    """A limit table written in a kernel module belongs in tuning/ (one module per op family)."""
    mod = importlib.import_module(f"reference_kernels.{path.stem}" if path.stem != "__init__" else "reference_kernels")
    own = {name for name, _, _ in _assignments(path)}
    tables = sorted(k for k in own if k.isupper() and _is_limit_table(getattr(mod, k, None)))
    assert not tables, f"{path.name} keeps limit tables {tables}: move them to reference_kernels/tuning/"
