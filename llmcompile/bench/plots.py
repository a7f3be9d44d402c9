"""Writing figures: the one place plots become files."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any


def save_png(fig: Any, path: Path | str, dpi: int = 110) -> None:
    """`fig` as a 256-colour palette PNG. Line and bar plots use a few colours, and the palette
    keeps a file ~3x smaller than matplotlib's RGBA: results folders travel with the tree to the
    GPU machine, whose carry limit they share with the CuTe DSL pack."""
    from PIL import Image  # (matplotlib's own dependency)

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    buf.seek(0)
    with Image.open(buf) as im:
        im.convert("RGB").quantize(256).save(path, format="PNG", optimize=True)
