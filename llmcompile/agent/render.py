"""The jinja2 environment over prompts/ and the reference kernels' sources: what both the prompts
(`prompting`) and the pattern templates (`patterns`) render from, kept apart so neither imports
the other to reach it."""

from __future__ import annotations

import ast
import importlib.resources
from typing import Any

import jinja2

_ENV = jinja2.Environment(
    loader=jinja2.FunctionLoader(lambda name: importlib.resources.files("prompts").joinpath(name).read_text()),
    undefined=jinja2.StrictUndefined,
    keep_trailing_newline=True,
    trim_blocks=False,
)


def render(template: str, **ctx: Any) -> str:
    return _ENV.get_template(template).render(**ctx)


def reference_source(module: str) -> str:
    return importlib.resources.files("reference_kernels").joinpath(f"{module}.py").read_text()


SHORT_BODY = 5  # lines of a function body that the interface keeps whole


def interface_source(module: str) -> str:
    """A reference module's source with each function's body of more than SHORT_BODY lines cut
    to its docstring, and its private helpers left out: what a caller needs (signatures, what
    each does, the dataclasses' fields and their comments) in about half the text. The bodies
    teach little that the reference kernels' use of them does not."""
    source = reference_source(module)
    lines = source.splitlines(keepends=True)
    cut: list[tuple[int, int, str]] = []  # (first body line, last body line, indent), 0-based
    tree = ast.parse(source)
    for node in tree.body:  # private helpers go whole, with the comment lines above them
        if isinstance(node, ast.FunctionDef | ast.ClassDef) and node.name.startswith("_"):
            start = min([node.lineno, *(d.lineno for d in node.decorator_list)]) - 1
            while start > 0 and lines[start - 1].startswith("#"):
                start -= 1
            cut.append((start, node.end_lineno - 1 + _blank_after(lines, node.end_lineno), ""))
    for node in ast.walk(tree):
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        first = node.body[0]
        keep = (
            isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str)
        )
        rest = node.body[1:] if keep else node.body
        if not rest:
            continue
        start = rest[0].lineno - 1
        floor = first.end_lineno if keep else start
        while start > floor and lines[start - 1].lstrip().startswith("#"):  # (a comment above goes with it)
            start -= 1
        if node.end_lineno - start <= SHORT_BODY:  # (a combine's few lines show how to write one)
            continue
        indent = " " * rest[0].col_offset
        cut.append((start, node.end_lineno - 1, indent))
    out: list[str] = []
    i = 0
    for start, end, indent in sorted(cut):
        if start < i:  # nested in a function already cut
            continue
        out += lines[i:start]
        if indent:
            out.append(f"{indent}...\n")
        i = end + 1
    out += lines[i:]
    return "".join(out)


def _blank_after(lines: list[str], end: int) -> int:
    """Blank lines after line `end` (1-based), which go with a definition cut whole."""
    k = 0
    while end + k < len(lines) and not lines[end + k].strip():
        k += 1
    return k
