"""The attention kernel's launch order (reference_kernels.attention.tile_of, the arithmetic the
kernel runs on Int32s) on ints: every (query tile, head) exactly once, head groups in turn,
longest first within a group under a causal mask."""

from __future__ import annotations

import pytest

from reference_kernels.attention import Attention, AttentionKnobs, tile_of


@pytest.mark.parametrize("heads", (1, 7, 16, 40, 64))
@pytest.mark.parametrize("m_blocks", (1, 3, 32))
@pytest.mark.parametrize("group", (1, 4, 16, 64))
@pytest.mark.parametrize("causal", (False, True))
def test_launch_order_covers_every_tile_once(heads: int, m_blocks: int, group: int, causal: bool) -> None:
    order = [tile_of(pos, heads, m_blocks, group, causal) for pos in range(heads * m_blocks)]
    assert sorted(order) == [(m, h) for m in range(m_blocks) for h in range(heads)]
    for pos, (m, h) in enumerate(order):
        first = pos // (group * m_blocks) * group
        assert first <= h < first + group  # the group's heads, and only those, in its span
        if pos % (group * m_blocks) and h // group == order[pos - 1][1] // group:
            # within a group the query tile never grows back (causal: longest first)
            prev = order[pos - 1][0]
            assert (m <= prev) if causal else (m >= prev)


def test_group_of_one_is_each_head_in_turn() -> None:
    order = [tile_of(pos, 3, 4, 1, True) for pos in range(12)]
    assert order[:4] == [(3, 0), (2, 0), (1, 0), (0, 0)] and order[4] == (3, 1)


@pytest.mark.parametrize(
    ("n", "dtype_bytes", "group"),
    # K and V of a head: 2 N D bytes each; the largest power of two of them within 50 MiB
    ((4096, 2, 16), (16384, 2, 4), (1024, 2, 64), (262144, 2, 1), (3000, 2, 32)),
)
def test_automatic_group_fits_l2(n: int, dtype_bytes: int, group: int) -> None:
    kernel = Attention(causal=True, knobs=AttentionKnobs(head_group=0))
    kernel.n, kernel.d = n, 128
    assert kernel.head_group(dtype_bytes) == group
    assert Attention(knobs=AttentionKnobs(head_group=8)).head_group(dtype_bytes) == 8


def test_default_group_by_mask() -> None:
    """Causal: a few heads longest first (CAUSAL_HEAD_GROUP, 8 up to N = 2K, then 4);
    otherwise each head in turn."""
    for n, group in ((1024, 8), (2048, 8), (2049, 4), (16384, 4)):
        causal, plain = Attention(causal=True), Attention()
        staged = Attention(causal=True, knobs=AttentionKnobs(stages=3))
        for kernel in (causal, plain, staged):
            kernel.n, kernel.d = n, 128
        assert causal.head_group(2) == staged.head_group(2) == group and plain.head_group(2) == 1
