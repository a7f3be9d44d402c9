"""Deliberately bad softmax kernels, each the honest base kernel with one defect, and the
verdict the judge must give it.

The base is a plain CuTe DSL softmax (one CTA of 128 threads a row, strided scalar loops,
warp shuffles then shared memory). It is correct for every M and N, and slow; each entry of
BAD replaces a snippet of it to plant one of the cheats or bugs that have fooled kernel
judges before. `tests/test_harness_gpu.py` runs them all on the GPU; the static and compile
ones also run in CI.
"""

from __future__ import annotations

from dataclasses import dataclass

BASE = """
import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32

THREADS = 128
LOG2_E = 1.4426950408889634


@cute.jit
def block_reduce(v: Float32, red: cute.Tensor, is_max: cutlass.Constexpr[bool]) -> Float32:
    for i in cutlass.range_constexpr(5):
        other = cute.arch.shuffle_sync_bfly(v, offset=16 >> i)
        v = cute.arch.fmax(v, other) if is_max else v + other
    # warp_idx() is a warp-collective shuffle: call it outside the lane-0 branch
    lane, warp = cute.arch.lane_idx(), cute.arch.warp_idx()
    if lane == 0:
        red[warp] = v
    cute.arch.barrier()
    out = red[0]
    for w in cutlass.range_constexpr(1, THREADS // 32):
        out = cute.arch.fmax(out, red[w]) if is_max else out + red[w]
    cute.arch.barrier()
    return out


@cute.jit
def softmax_row(mX: cute.Tensor, mO: cute.Tensor, row: Int32, red: cute.Tensor):
    tidx, _, _ = cute.arch.thread_idx()
    n = mX.shape[1]
    m = -Float32.inf
    for c in cutlass.range(tidx, n, THREADS):
        m = cute.arch.fmax(m, Float32(mX[row, c]))
    m = block_reduce(m, red, True)
    s = Float32(0.0)
    for c in cutlass.range(tidx, n, THREADS):
        s += cute.math.exp2((Float32(mX[row, c]) - m) * LOG2_E, fastmath=True)
    s = block_reduce(s, red, False)
    inv = 1.0 / s
    for c in cutlass.range(tidx, n, THREADS):
        mO[row, c] = (cute.math.exp2((Float32(mX[row, c]) - m) * LOG2_E, fastmath=True) * inv).to(mO.element_type)


@cute.kernel
def softmax_kernel(mX: cute.Tensor, mO: cute.Tensor):
    bidx, _, _ = cute.arch.block_idx()
    smem = cutlass.utils.SmemAllocator()
    red = smem.allocate_tensor(Float32, cute.make_layout(THREADS // 32))
    softmax_row(mX, mO, bidx, red)


@cute.jit
def launch(mX: cute.Tensor, mO: cute.Tensor, stream):
    softmax_kernel(mX, mO).launch(grid=[mX.shape[0], 1, 1], block=[THREADS, 1, 1], stream=stream)
"""


@dataclass(frozen=True)
class Bad:
    name: str
    why: str
    edits: tuple[tuple[str, str], ...]  # (snippet of BASE, replacement)
    status: str  # the verdict status the judge must give
    checks: tuple[str, ...] = ()  # for `wrong`: acceptable failing checks (empty: any)
    gpu: bool = True  # needs the GPU to be caught
    timed_shape: tuple[int, int] | None = None  # caught only when timed at this (M, N)

    def source(self) -> str:
        src = BASE
        for old, new in self.edits:
            assert src.count(old) >= 1, f"{self.name}: snippet not in BASE: {old!r}"
            src = src.replace(old, new, 1)
        return src


_STORE_LOOP = "    for c in cutlass.range(tidx, n, THREADS):\n        mO[row, c]"
_SUM = "s += cute.math.exp2((Float32(mX[row, c]) - m) * LOG2_E, fastmath=True)"

BAD: tuple[Bad, ...] = (
    Bad(
        "calls_torch",
        "computes the answer with torch on the host",
        (("import cutlass\n", "import torch\nimport cutlass\n"),),
        "static_rejected",
        gpu=False,
    ),
    Bad(
        "torch_through_cutlass",
        "reaches torch through cutlass.torch without importing it",
        (("    softmax_kernel(mX, mO)", "    cutlass.torch.dtype(mX)\n    softmax_kernel(mX, mO)"),),
        "static_rejected",
        gpu=False,
    ),
    Bad(
        "dynamic_import",
        "imports a module by name at run time",
        (("THREADS = 128\n", "THREADS = 128\n_os = __import__('o' + 's')\n"),),
        "static_rejected",
        gpu=False,
    ),
    Bad(
        "no_entry",
        "names its entry something else than the contract's `launch`",
        (("def launch(", "def run("),),
        "static_rejected",
        gpu=False,
    ),
    Bad(
        "does_not_compile",
        "uses a name it never defined",
        (("    inv = 1.0 / s\n", "    inv = 1.0 / s * scale\n"),),
        "compile_error",
        gpu=False,
    ),
    Bad(
        "leaves_last_column",
        "never writes the last column of each row",
        ((_STORE_LOOP, "    for c in cutlass.range(tidx, n - 1, THREADS):\n        mO[row, c]"),),
        "wrong",
        ("unwritten",),
    ),
    Bad(
        "hardcodes_n",
        "assumes the benchmark's N = 4096 whatever the tensor says",
        (("    n = mX.shape[1]\n", "    n = 4096\n"),),
        "wrong",
    ),
    Bad(
        "reads_past_row",
        "sums one element past the end of each row (the next row's, or past the tensor)",
        (
            (
                "    for c in cutlass.range(tidx, n, THREADS):\n        s +=",
                "    for c in cutlass.range(tidx, n + 1, THREADS):\n        s +=",
            ),
        ),
        "wrong",
    ),
    Bad(
        "writes_past_row",
        "stores one element past the end of each row, past the tensor on the last row",
        ((_STORE_LOOP, "    for c in cutlass.range(tidx, n + 1, THREADS):\n        mO[row, c]"),),
        "wrong",
    ),
    Bad(
        "race_no_barrier",
        "reads the other warps' partial results from shared memory before they are written",
        (
            (
                "        red[warp] = v\n    cute.arch.barrier()\n",
                "        red[warp] = v\n",
            ),
        ),
        "wrong",
    ),
    Bad(
        "even_m_only",
        "does two rows a CTA with no bound check: right only when M is even",
        (
            (
                "    softmax_row(mX, mO, bidx, red)\n",
                "    softmax_row(mX, mO, 2 * bidx, red)\n    softmax_row(mX, mO, 2 * bidx + 1, red)\n",
            ),
            ("grid=[mX.shape[0], 1, 1]", "grid=[(mX.shape[0] + 1) // 2, 1, 1]"),
        ),
        "wrong",
    ),
    Bad(
        "skips_written_rows",
        "computes a row only if its output still holds the NaN poison: stale results on reuse",
        (
            (
                "    softmax_row(mX, mO, bidx, red)\n",
                "    first = Float32(mO[bidx, 0])\n    if first != first:\n        softmax_row(mX, mO, bidx, red)\n",
            ),
        ),
        "wrong",
        ("stale",),
    ),
    Bad(
        "scribbles_on_input",
        "uses its input as scratch space",
        ((".to(mO.element_type)\n", ".to(mO.element_type)\n        mX[row, c] = mO[row, c]\n"),),
        "wrong",
    ),
    Bad(
        "no_max_subtraction",
        "skips the max subtraction: right on small random logits, overflows on large ones",
        ((_SUM, "s += cute.math.exp2(Float32(mX[row, c]) * LOG2_E, fastmath=True)"),),
        "wrong",
    ),
    Bad(
        "skips_rows_when_timed",
        "leaves the last 4% of rows unwritten whenever M > 100000: only at the benchmark's sizes",
        (
            (
                "    softmax_row(mX, mO, bidx, red)\n",
                "    if mX.shape[0] <= 100000 or bidx * 25 < mX.shape[0] * 24:\n"
                "        softmax_row(mX, mO, bidx, red)\n",
            ),
        ),
        "wrong",
        ("timed_output",),
        timed_shape=(262144, 1024),
    ),
    Bad(
        "hangs",
        "spins on a shared-memory flag nobody sets",
        (
            (
                "    softmax_row(mX, mO, bidx, red)\n",
                "    flag = smem.allocate_tensor(Int32, cute.make_layout(2))\n"
                "    flag[0] = Int32(0)\n"
                "    cute.arch.barrier()\n"
                "    spins = Int32(0)\n"
                "    while flag[0] == Int32(0):\n"
                "        spins = spins + Int32(1)\n"
                "        flag[1] = spins\n"  # a store each turn: the loop cannot be optimised away
                "    softmax_row(mX, mO, bidx, red)\n",
            ),
        ),
        "timeout",
    ),
)
