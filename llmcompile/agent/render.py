"""The jinja2 environment over prompts/ and the reference kernels' sources: what both the prompts
(`prompting`) and the pattern templates (`patterns`) render from, kept apart so neither imports
the other to reach it."""

from __future__ import annotations

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
