from pathlib import Path

import pytest


def test_save_png_writes_a_palette_png_smaller_than_matplotlibs(tmp_path: Path) -> None:
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from PIL import Image

    from llmcompile.bench.plots import save_png

    fig, ax = plt.subplots(figsize=(6, 4))
    for k in range(5):
        ax.plot(range(20), [(i * (k + 1)) % 7 for i in range(20)], marker="o", label=f"line {k}")
    ax.legend()
    save_png(fig, tmp_path / "p.png")
    fig.savefig(tmp_path / "rgba.png", dpi=110)
    plt.close(fig)
    with Image.open(tmp_path / "p.png") as im, Image.open(tmp_path / "rgba.png") as ref:
        assert im.format == "PNG" and im.mode == "P" and im.size == ref.size
        # every colour of the plot survives: each line's colour is in the palette
        used = {c for _, c in im.convert("RGB").getcolors(maxcolors=1 << 16)}
        for k in range(5):
            rgb = tuple(round(255 * v) for v in matplotlib.colors.to_rgb(f"C{k}"))
            assert min(sum(abs(a - b) for a, b in zip(rgb, c)) for c in used) <= 12, rgb
    assert (tmp_path / "p.png").stat().st_size < (tmp_path / "rgba.png").stat().st_size
