"""The package's layers (docs/layout.md): each imports only from layers below it, and no two
modules import each other, at module level or inside a function. These tests fail when a new
import reaches upward or closes a circle."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "llmcompile"
KERNELS = PKG.parent / "reference_kernels"

# lowest first: a module may import from its own layer or any layer before it
LAYERS: list[tuple[str, ...]] = [
    ("specs",),  # what an op is: data, references, contract
    ("runtime", "kernels", "loader"),  # calling and shipping kernels
    ("bench",),  # timing and baselines
    ("harness",),  # the judge
    ("agent",),  # prompts, providers, the loop, runs
    ("suites",),  # evals over many problems
    ("cli", "doctor", "entry", "__main__", "__init__"),  # what the user runs
]


def _module(path: Path) -> str:
    parts = path.relative_to(PKG.parent).with_suffix("").parts  # (both packages sit side by side)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _layer(module: str) -> int:
    top = module.split(".")[1] if "." in module else "__init__"
    for i, names in enumerate(LAYERS):
        if top in names:
            return i
    raise AssertionError(f"{module} is in no layer: add its package to LAYERS (and docs/layout.md)")


def _type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or (
        isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING"
    )


def _imports(path: Path, root: Path = PKG) -> set[str]:
    """The modules of package `root` that `path` imports, wherever in the file (type-only imports
    excepted)."""
    found: set[str] = set()
    known = {_module(p) for p in root.rglob("*.py")}
    top = root.name

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _type_checking(node):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == top)
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == top:
            for a in node.names:  # `from llmcompile.x import y`: y may itself be a module
                sub = f"{node.module}.{a.name}"
                found.add(sub if sub in known else node.module)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text()))
    return found


GRAPH = {_module(p): _imports(p) for p in sorted(PKG.rglob("*.py"))}


@pytest.mark.parametrize("module", sorted(GRAPH))
def test_imports_only_from_layers_below(module: str) -> None:
    upward = sorted(m for m in GRAPH[module] if m != "llmcompile" and _layer(m) > _layer(module))
    assert not upward, f"{module} (layer {LAYERS[_layer(module)]}) imports from above: {upward}"


# The reference kernels, lowest first: the tuned tables, the row template's host side, its device
# side, the template under one name (`reduce as R`), then the op and pattern modules.
KERNEL_LAYERS = ("tuning", "row_plan", "row_io", "reduce")
KERNEL_GRAPH = {_module(p): _imports(p, KERNELS) for p in sorted(KERNELS.rglob("*.py"))}


def _kernel_layer(module: str) -> int:
    name = module.split(".")[1] if "." in module else "tuning"  # (the package's own __init__: nothing)
    return KERNEL_LAYERS.index(name) if name in KERNEL_LAYERS else len(KERNEL_LAYERS)


@pytest.mark.parametrize("module", sorted(KERNEL_GRAPH))
def test_reference_kernels_import_only_from_below(module: str) -> None:
    """An op reads the template and its tables; the template never reads an op."""
    upward = sorted(m for m in KERNEL_GRAPH[module] if _kernel_layer(m) > _kernel_layer(module))
    assert not upward, f"{module} imports from above it: {upward}"


@pytest.mark.parametrize("graph", [GRAPH, KERNEL_GRAPH], ids=["llmcompile", "reference_kernels"])
def test_no_import_cycles(graph: dict[str, set[str]]) -> None:
    graph = {m: {d for d in deps if d in graph and d != m} for m, deps in graph.items()}
    for pkg in [m for m in graph if (PKG.parent / m.replace(".", "/") / "__init__.py").exists()]:
        graph[pkg] = {d for d in graph[pkg] if not d.startswith(pkg + ".")}  # a facade re-exporting its own
    state: dict[str, int] = {}
    stack: list[str] = []

    def walk(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for d in sorted(graph[m]):
            if state.get(d) == 1:
                raise AssertionError("import cycle: " + " -> ".join([*stack[stack.index(d) :], d]))
            if d not in state:
                walk(d)
        stack.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            walk(m)


def test_the_checker_sees_function_level_and_from_imports(tmp_path: Path) -> None:
    f = tmp_path / "m.py"
    f.write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from llmcompile.suites import runner\n"
        "def g():\n    from llmcompile.agent import loop\n    import llmcompile.bench.grid\n"
    )
    assert _imports(f) == {"llmcompile.agent.loop", "llmcompile.bench.grid"}


ROOT = PKG.parent
# bytes: the tree goes to the GPU with the device pack (60.73 MB) under 64 MiB (67.1 MB); 2.35 MB
# leaves 4.0 MB for what a session carries beside them (a session's scratch: 1.2-2.0 MB)
TRAVEL_LIMIT = 2_350_000


def _tracked() -> list[Path]:
    import subprocess

    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    return [ROOT / p for p in out.decode().split("\0") if p]


def test_the_tree_that_travels_to_the_gpu_fits_beside_the_device_pack() -> None:
    files = [p for p in _tracked() if p.is_file()]
    size = sum(p.stat().st_size for p in files)
    biggest = sorted(files, key=lambda p: p.stat().st_size)[-5:]
    assert size < TRAVEL_LIMIT, f"{size:,} bytes tracked; the largest: " + ", ".join(
        f"{p.relative_to(ROOT)} ({p.stat().st_size:,})" for p in biggest
    )


def test_the_readme_is_short_and_opens_with_the_two_commands() -> None:
    # a newcomer's five minutes (issue 50): it had drifted to 153 lines
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 150, f"README.md is {len(lines)} lines: move reference to docs/"
    fence = lines.index("```bash")
    assert "pip install" in lines[fence + 1] and "pytest" in lines[fence + 2]


def test_every_results_folder_says_what_it_is_and_is_in_the_index() -> None:
    index = (ROOT / "docs" / "results.md").read_text()
    for folder in sorted(p for p in (ROOT / "evals" / "results").iterdir() if p.is_dir()):
        assert (folder / "README.md").is_file(), f"{folder.name} has no README"
        assert f"`{folder.name}/`" in index, f"{folder.name} is not in docs/results.md"
