"""The windowed-pooling template: max and average pooling over 1, 2 or 3 spatial dims, with
torch's kernel, stride, padding and dilation (ceil_mode off).

The input is (M, C, *spatial), contiguous; so is the output. A CTA owns `rows` consecutive
output rows (along the second-to-last spatial dim) of one plane and depth, and a tile of
`cols` x num_threads columns; a thread owns columns tidx, tidx + num_threads, ... of it.
Consecutive lanes own consecutive columns, so every load of a warp is one coalesced run of
an input row, and the overlap of neighbouring windows along the row is served by L1; the
CTA's row and plane come from one division, not one a thread. Along the rows, the thread
loads each input row its `rows` windows share once and folds it into every window that
covers it (a 4 x 4 window at stride 1: 7 rows loaded for 4 outputs, not 16).

Max pooling pads with -inf and propagates NaN as torch does; average pooling divides by the
window's size (count_include_pad, torch's default), or by its elements inside the input, or
by `divisor_override`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64, const_expr

from reference_kernels.reduce import WARP
from reference_kernels.reduce import vector_at as _at

KINDS = ("max", "avg")


@dataclass(frozen=True)
class PoolKnobs:
    num_threads: int = 256
    rows: int | None = None  # output rows a thread computes; None: 4 where windows overlap along rows, else 1
    cols: int = 4  # output columns a thread computes, num_threads apart
    stage: bool | None = None  # input rows through shared memory; None: where windows overlap along a row at stride 1


@dataclass(frozen=True)
class PoolShape:
    """Spatial sizes and window parameters, 3-D (a 1-D or 2-D pool has 1s in front)."""

    size: tuple[int, int, int]  # input D, H, W
    out: tuple[int, int, int]
    kernel: tuple[int, int, int]
    stride: tuple[int, int, int]
    padding: tuple[int, int, int]
    dilation: tuple[int, int, int]
    rows: int
    num_threads: int
    cols: int
    stage: bool

    @property
    def staged_cols(self) -> int:
        """Input columns a staged tile holds a row: its outputs' windows, end to end."""
        return (self.num_threads * self.cols - 1) * self.stride[2] + (self.kernel[2] - 1) * self.dilation[2] + 1

    @property
    def row_blocks(self) -> int:
        return math.ceil(self.out[1] / self.rows)

    @property
    def col_tiles(self) -> int:
        return math.ceil(self.out[2] / (self.num_threads * self.cols))

    def row_offsets(self) -> list[int]:
        """Input rows (relative to the first output row's window start) the thread's windows touch."""
        return sorted(
            {v * self.stride[1] + k * self.dilation[1] for v in range(self.rows) for k in range(self.kernel[1])}
        )


def out_size(size: int, k: int, s: int, p: int, d: int) -> int:
    return (size + 2 * p - d * (k - 1) - 1) // s + 1


def _triple(v: int | tuple, dims: int, name: str, fill: int) -> tuple[int, int, int]:
    """A window parameter over 3 dims: `fill` in front of a 1-D or 2-D pool's."""
    t = (v,) * dims if isinstance(v, int) else tuple(v)
    if len(t) != dims or not all(isinstance(x, int) for x in t):
        raise ValueError(f"{name}={v!r} must be an int or {dims} ints")
    return (fill,) * (3 - dims) + t


def resolve_shape(knobs: PoolKnobs, spatial: tuple[int, ...], kernel, stride, padding, dilation) -> PoolShape:
    dims = len(spatial)
    if not 1 <= dims <= 3:
        raise ValueError(f"pooling over {dims} dims: 1, 2 or 3")
    if knobs.num_threads % WARP or not WARP <= knobs.num_threads <= 1024:
        raise ValueError(f"num_threads={knobs.num_threads} must be a multiple of 32, <= 1024")
    k, s = _triple(kernel, dims, "kernel", 1), _triple(stride, dims, "stride", 1)
    p, d = _triple(padding, dims, "padding", 0), _triple(dilation, dims, "dilation", 1)
    size = (1,) * (3 - dims) + tuple(spatial)
    if any(x < 1 for x in (*k, *s, *d)) or any(2 * pp > kk for pp, kk in zip(p, k)):
        raise ValueError("kernel, stride and dilation must be >= 1, padding at most half the kernel")
    out = tuple(out_size(*a) for a in zip(size, k, s, p, d))
    if any(o < 1 for o in out):
        raise ValueError(f"the window ({k}) does not fit the input {size}")
    overlap = dims >= 2 and s[1] < k[1] * d[1]
    rows = knobs.rows or (4 if overlap else 1)
    if not 1 <= rows <= 16 or not 1 <= knobs.cols <= 16:
        raise ValueError(f"rows={rows} and cols={knobs.cols} must be 1..16")
    # narrow outputs: fewer columns a thread, then fewer threads, so that a CTA is not mostly idle
    cols = max(1, min(knobs.cols, math.ceil(out[2] / knobs.num_threads)))
    threads = min(knobs.num_threads, math.ceil(out[2] / WARP) * WARP)
    # at stride 1 a window's taps are consecutive lanes' loads of one row: from L1 each costs a
    # load of the whole warp (two cache lines where unaligned), from shared memory one wavefront
    stage = knobs.stage if knobs.stage is not None else (s[2] == 1 and k[2] > 1)
    return PoolShape(size, out, k, s, p, d, min(rows, out[1]), threads, cols, stage)


class Pool:
    """`kind` pooling of mX (M, C, *spatial) into mO (M, C, *out) over the spatial dims."""

    def __init__(
        self,
        kind: str,
        kernel,
        stride=None,
        padding=0,
        dilation=1,
        count_include_pad: bool = True,
        divisor_override: int | None = None,
        knobs: PoolKnobs = PoolKnobs(),
    ) -> None:
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
        self.kind, self.kernel, self.stride = kind, kernel, stride if stride is not None else kernel
        self.padding, self.dilation = padding, dilation
        self.count_include_pad, self.divisor_override, self.knobs = count_include_pad, divisor_override, knobs

    @cute.jit
    def __call__(self, mX: cute.Tensor, mO: cute.Tensor, stream):
        spatial = const_expr(tuple(mX.shape[2:]))
        self.shape = resolve_shape(self.knobs, spatial, self.kernel, self.stride, self.padding, self.dilation)
        sh = self.shape
        planes = Int64(mX.shape[0]) * mX.shape[1]  # (n, c) pairs
        ctas = planes * sh.out[0] * sh.row_blocks * sh.col_tiles
        self.kernel_(mX, mO, planes).launch(grid=[Int32(ctas), 1, 1], block=[sh.num_threads, 1, 1], stream=stream)

    def _rows_touched(self, plane: Int64, od, ih0, ok, iw_start):
        """(slot, offset index, row in the input, flat offset of column `iw_start`) of every input
        row the thread's windows touch, depth-major: traced in Python, a row a slot."""
        sh = self.shape
        (D, H, W), offsets = sh.size, sh.row_offsets()
        for kd in range(sh.kernel[0]):
            idd = od * sh.stride[0] - sh.padding[0] + kd * sh.dilation[0]
            d_ok = ok & (idd >= 0) & (idd < D)
            for o, off in enumerate(offsets):
                ih = ih0 + off
                yield kd * len(offsets) + o, o, d_ok & (ih >= 0) & (ih < H), ((plane * D + idd) * H + ih) * W + iw_start

    @cute.kernel
    def kernel_(self, mX: cute.Tensor, mO: cute.Tensor, planes: Int64):
        sh = self.shape
        W, (Do, Ho, Wo) = sh.size[2], sh.out
        (kd_n, kh_n, kw_n), (sh_, sw) = sh.kernel, sh.stride[1:]
        (ph, pw), (dh, dw) = sh.padding[1:], sh.dilation[1:]
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        # the CTA's tile: (plane, od, row block, column tile), the column tile fastest
        r = Int64(bidx)
        ct = r % sh.col_tiles
        r = r // sh.col_tiles
        oh0 = (r % sh.row_blocks) * sh.rows
        r = r // sh.row_blocks
        od = r % Do
        plane = r // Do
        live = plane < planes
        is_max = const_expr(self.kind == "max")
        fill = Float32(-math.inf) if const_expr(is_max) else Float32(0.0)
        offsets = const_expr(sh.row_offsets())
        ih0 = oh0 * sh_ - ph
        tile = sh.num_threads * sh.cols
        iw_tile = (ct * tile) * sw - pw  # the tile's first window's first column
        sX = None
        if const_expr(sh.stage):
            # every input row the tile's windows touch, their columns end to end, loaded once
            # (consecutive lanes, consecutive columns) and padded with the fill
            span = const_expr(sh.staged_cols)
            smem = cutlass.memory.SmemAllocator()
            sX = smem.allocate_tensor(Float32, cute.make_layout((kd_n * len(offsets), span), stride=(span, 1)), 16)
            for slot, _, row_ok, base in self._rows_touched(plane, od, ih0, live, iw_tile):
                for i in cutlass.range_constexpr(math.ceil(span / sh.num_threads)):
                    j = i * sh.num_threads + tidx
                    iw = iw_tile + j
                    v = fill
                    if row_ok & (iw >= 0) & (iw < W) & (j < span):
                        v = Float32(_at(mX, base + j, 1)[0])
                    if j < span:
                        sX[slot, j] = v
            cute.arch.barrier()
        for c in cutlass.range_constexpr(sh.cols):
            ow = ct * (sh.num_threads * sh.cols) + c * sh.num_threads + tidx
            col_ok = live & (ow < Wo)
            iw0 = ow * sw - pw
            acc = [fill for _ in range(sh.rows)]
            cnt = [Int32(0) for _ in range(sh.rows)]  # elements inside the input (count_include_pad off)
            for slot, o, row_ok, base in self._rows_touched(plane, od, ih0, col_ok, iw0):
                vals = []
                for kw in cutlass.range_constexpr(kw_n):
                    iw = iw0 + kw * dw
                    ok = row_ok & (iw >= 0) & (iw < W)
                    v = fill
                    if const_expr(sh.stage):
                        v = sX[slot, (c * sh.num_threads + tidx) * sw + kw * dw]
                    elif ok:
                        v = Float32(_at(mX, base + kw * dw, 1)[0])
                    vals.append((ok, v))
                # fold the row into every window of the thread that covers it
                for v_i in cutlass.range_constexpr(sh.rows):
                    kh = const_expr((offsets[o] - v_i * sh_) // dh)
                    if const_expr(0 <= kh < kh_n and v_i * sh_ + kh * dh == offsets[o]):
                        for ok, v in vals:
                            if const_expr(is_max):
                                acc[v_i] = cute.arch.fmax(acc[v_i], v, nan=True)  # NaN wins, as in torch
                            else:
                                acc[v_i] = acc[v_i] + v
                                cnt[v_i] = cnt[v_i] + cutlass.select_(ok, Int32(1), Int32(0))
            for v_i in cutlass.range_constexpr(sh.rows):
                oh = oh0 + v_i
                res = acc[v_i]
                if const_expr(not is_max):
                    if const_expr(self.divisor_override is not None):
                        res = res / Float32(self.divisor_override)
                    elif const_expr(self.count_include_pad):
                        res = res * Float32(1.0 / (kd_n * kh_n * kw_n))
                    else:
                        res = res / Float32(cnt[v_i])
                if col_ok & (oh < Ho):
                    _at(mO, ((plane * Do + od) * Ho + oh) * Wo + ow, 1)[0] = mO.element_type(res)
