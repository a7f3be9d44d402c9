"""The row template's host side (reference_kernels.row_plan): limit tables and knob resolution."""

from __future__ import annotations

import pytest

from reference_kernels.row_plan import MAX_N, RowKnobs, fill_knobs, pick, resolve_tiling


def test_pick_takes_first_limit_at_or_above() -> None:
    table = ((64, 8), (128, 16), (None, 32))
    assert [pick(table, n) for n in (1, 64, 65, 128, 10**6)] == [8, 8, 16, 16, 32]


@pytest.mark.parametrize("n", [256, 1000, 4096, 5000, 5001, 65536, 128256, 151936, 262144])
@pytest.mark.parametrize("width", [16, 32])
def test_default_tiling_covers_row_exactly_once(n: int, width: int) -> None:
    t = resolve_tiling(RowKnobs(), width, n)
    assert t.cols_per_cta * t.cluster_n >= n  # the cluster covers the row
    assert t.cols_per_cta * (t.cluster_n - 1) < n  # and no CTA is left without columns
    assert t.cols_per_cta % (t.vec * t.threads_per_row) == 0
    assert n % t.vec == 0  # vectors never straddle rows
    assert t.vec * width <= 128
    assert t.values_per_thread <= 128
    assert t.even_n == (t.cols_per_cta * t.cluster_n == n)


def test_vector_shrinks_to_what_n_allows() -> None:
    assert resolve_tiling(RowKnobs(), 16, 4096).vec == 8
    assert resolve_tiling(RowKnobs(), 16, 4100).vec == 4
    assert resolve_tiling(RowKnobs(), 16, 5001).vec == 1
    assert resolve_tiling(RowKnobs(), 32, 4096).vec == 4
    # an fp32 output beside a bf16 input caps the vector at 4 elements
    assert resolve_tiling(RowKnobs(), 16, 4096, widest_bits=32).vec == 4


def test_cluster_grows_with_n_and_is_capped_for_short_rows() -> None:
    assert resolve_tiling(RowKnobs(), 16, 4096).cluster_n == 1
    assert resolve_tiling(RowKnobs(), 16, 262144).cluster_n == 16
    # a 16-CTA cluster asked for on a short row shrinks until every CTA has columns
    # (1024 bf16 elements, 32 threads of 8-vectors: 256 columns a CTA, so at most 4 CTAs)
    assert resolve_tiling(RowKnobs(cluster_n=16), 16, 1024).cluster_n == 4


@pytest.mark.parametrize(
    "knobs, match",
    [
        (RowKnobs(threads_per_row=48), "power of two"),
        (RowKnobs(num_threads=100), "multiple of 32"),
        (RowKnobs(cluster_n=3), "cluster_n=3"),
        (RowKnobs(vec_bits=256), "vec_bits"),
        (RowKnobs(threads_per_row=8, cluster_n=1), "values per thread"),
        (RowKnobs(row_loop=0), "row_loop=0"),
    ],
)
def test_bad_knobs_are_named(knobs: RowKnobs, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        resolve_tiling(knobs, 32, 65536)


def test_n_outside_range_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="outside the supported range"):
        resolve_tiling(RowKnobs(), 16, MAX_N + 1)


def test_row_loop_doubles_buffers_only_when_looping() -> None:
    one = resolve_tiling(RowKnobs(), 16, 262144)
    loop = resolve_tiling(RowKnobs(row_loop=4), 16, 262144)
    assert (one.row_loop, one.stages) == (1, 1)
    assert (loop.row_loop, loop.stages) == (4, 2)
    assert loop.tiler_mn == one.tiler_mn and loop.cluster_n == one.cluster_n


def test_register_prefetch_only_for_an_unstaged_loop() -> None:
    """prefetch_registers needs a next tile (row_loop > 1) and registers to load it into
    (a staged loop prefetches into shared memory instead)."""

    def prefetches(**knobs: object) -> bool:
        return resolve_tiling(RowKnobs(prefetch_registers=True, **knobs), 16, 262144).prefetch_registers

    assert prefetches(row_loop=2, stage_smem=False)
    assert not prefetches(stage_smem=False)
    assert not prefetches(row_loop=2, stage_smem=True)
    assert not resolve_tiling(RowKnobs(row_loop=2, stage_smem=False), 16, 262144).prefetch_registers


def test_an_ops_knob_set_is_taken_whole_or_not_at_all() -> None:
    table = ((1024, {}), (None, {"row_loop": 2, "threads_per_row": 512, "columns": "smem"}))
    assert fill_knobs(RowKnobs(), table, 512) == RowKnobs()
    filled = fill_knobs(RowKnobs(num_threads=512), table, 4096)
    assert (filled.row_loop, filled.threads_per_row, filled.columns, filled.num_threads) == (2, 512, "smem", 512)
    # agreeing with the set is not a conflict; another value for one of its fields is
    assert fill_knobs(RowKnobs(row_loop=2), table, 4096).columns == "smem"
    assert fill_knobs(RowKnobs(columns="early"), table, 4096) == RowKnobs(columns="early")
