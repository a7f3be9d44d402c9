"""Deliberately bad kernels, each an honest base kernel with one defect, and the verdict the
judge must give it.

The bases are a plain CuTe DSL softmax and rmsnorm (one CTA of 128 threads a row, strided scalar
loops, warp shuffles then shared memory). They are correct for every M and N, and slow; each entry
of BAD replaces snippets of one to plant one of the cheats or bugs that have fooled kernel judges
before (or could fool ours, by its code: docs/judge.md). `tests/test_harness_gpu.py` runs them all
on the GPU beside the bases themselves (their honest twins); the static and compile ones also run
in CI, where every entry is compiled for sm_90a.
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


RMSNORM_BASE = """
import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32

THREADS = 128


@cute.jit
def block_sum(v: Float32, red: cute.Tensor) -> Float32:
    for i in cutlass.range_constexpr(5):
        v = v + cute.arch.shuffle_sync_bfly(v, offset=16 >> i)
    lane, warp = cute.arch.lane_idx(), cute.arch.warp_idx()
    if lane == 0:
        red[warp] = v
    cute.arch.barrier()
    out = red[0]
    for w in cutlass.range_constexpr(1, THREADS // 32):
        out = out + red[w]
    cute.arch.barrier()
    return out


@cute.kernel
def rmsnorm_kernel(mX: cute.Tensor, mW: cute.Tensor, mO: cute.Tensor, eps: Float32):
    tidx, _, _ = cute.arch.thread_idx()
    row, _, _ = cute.arch.block_idx()
    smem = cutlass.utils.SmemAllocator()
    red = smem.allocate_tensor(Float32, cute.make_layout(THREADS // 32))
    n = mX.shape[1]
    s = Float32(0.0)
    for c in cutlass.range(tidx, n, THREADS):
        v = Float32(mX[row, c])
        s += v * v
    s = block_sum(s, red)
    rstd = cute.math.rsqrt(s / n + eps, fastmath=True)
    for c in cutlass.range(tidx, n, THREADS):
        mO[row, c] = (Float32(mX[row, c]) * rstd * Float32(mW[c])).to(mO.element_type)


@cute.jit
def launch(mX: cute.Tensor, mW: cute.Tensor, mO: cute.Tensor, eps: Float32, stream):
    rmsnorm_kernel(mX, mW, mO, eps).launch(grid=[mX.shape[0], 1, 1], block=[THREADS, 1, 1], stream=stream)
"""

BASES = {"softmax": BASE, "rmsnorm": RMSNORM_BASE}


@dataclass(frozen=True)
class Bad:
    name: str
    why: str
    edits: tuple[tuple[str, str], ...]  # (snippet of its base, replacement)
    status: str  # the verdict status the judge must give
    checks: tuple[str, ...] = ()  # for `wrong`: acceptable failing checks (empty: any)
    gpu: bool = True  # needs the GPU to be caught
    timed_shape: tuple[int, int] | None = None  # caught only when timed at this (M, N)
    op: str = "softmax"  # the base (and the op it is judged as)

    def source(self) -> str:
        src = BASES[self.op]
        for old, new in self.edits:
            assert src.count(old) >= 1, f"{self.name}: snippet not in its base: {old!r}"
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

# Where the judge's attention has to be: writes into or past inputs, inputs used as scratch,
# answers that hold only for the inputs or calls verification looks at (issue 45).
_ROW_CALL = "    softmax_row(mX, mO, bidx, red)\n"


def _with_workspace(elems: int) -> tuple[tuple[str, str], ...]:
    """The softmax base given a workspace of `elems` floats (mW, after the output)."""
    return (
        ("THREADS = 128\n", f"THREADS = 128\nWORKSPACE = {elems}\n"),
        (
            "def softmax_kernel(mX: cute.Tensor, mO: cute.Tensor):",
            "def softmax_kernel(mX: cute.Tensor, mO: cute.Tensor, mW: cute.Tensor):",
        ),
        (
            "def launch(mX: cute.Tensor, mO: cute.Tensor, stream):",
            "def launch(mX: cute.Tensor, mO: cute.Tensor, mW: cute.Tensor, stream):",
        ),
        ("    softmax_kernel(mX, mO).launch(", "    softmax_kernel(mX, mO, mW).launch("),
    )


def _slot_lookup(head: int) -> str:
    """The workspace cheats' lookup: a slot per input set, each row `head` floats (its key, the
    row's first four elements, and anything else) then its answer; `hit` the slot whose key
    matches, `free` the first never written (NaN)."""
    return (
        "    tidx, _, _ = cute.arch.thread_idx()\n"
        "    n = mX.shape[1]\n"
        f"    per = mX.shape[0] * (n + {head})\n"
        f"    at = bidx * (n + {head})\n"
        "    hit = Int32(-1)\n"
        "    free = Int32(-1)\n"
        "    for s in cutlass.range(WORKSPACE // per):\n"
        "        b = s * per + at\n"
        "        same = mW[b] == Float32(mX[bidx, 0]) and mW[b + 1] == Float32(mX[bidx, 1])\n"
        "        same = same and mW[b + 2] == Float32(mX[bidx, 2]) and mW[b + 3] == Float32(mX[bidx, 3])\n"
        "        if hit < 0 and same:\n"
        "            hit = s\n"
        "        if free < 0 and mW[b] != mW[b]:\n"
        "            free = s\n"
    )


_WITH_WORKSPACE = _with_workspace(4)
_RMS_STORE = "        mO[row, c] = (Float32(mX[row, c]) * rstd * Float32(mW[c])).to(mO.element_type)\n"
INPUT_WRITE = ("input_write", "out_of_bounds_write", "input_modified")
NEW: tuple[Bad, ...] = (
    Bad(
        "input_as_scratch_restored",
        "parks its exponentials in x and writes x's values back before it returns: the inputs are "
        "bit-identical afterwards, but anything reading x meanwhile reads garbage",
        (
            (
                "    s = Float32(0.0)\n    for c in cutlass.range(tidx, n, THREADS):\n        s +=",
                "    for c in cutlass.range(tidx, n, THREADS):\n"
                "        mO[row, c] = mX[row, c]\n"
                "        mX[row, c] = cute.math.exp2((Float32(mX[row, c]) - m) * LOG2_E, fastmath=True).to(mX.element_type)\n"
                "    s = Float32(0.0)\n    for c in cutlass.range(tidx, n, THREADS):\n        s += Float32(mX[row, c])\n"
                "        s +=",
            ),
            ("        s += cute.math.exp2((Float32(mX[row, c]) - m) * LOG2_E, fastmath=True)\n", "        s += 0.0\n"),
            (
                "        mO[row, c] = (cute.math.exp2((Float32(mX[row, c]) - m) * LOG2_E, fastmath=True) * inv).to(mO.element_type)\n",
                "        e = Float32(mX[row, c])\n        mX[row, c] = mO[row, c]\n        mO[row, c] = (e * inv).to(mO.element_type)\n",
            ),
        ),
        "wrong",
        INPUT_WRITE,
    ),
    Bad(
        "input_as_scratch_left",
        "parks its exponentials in x and leaves them there",
        ((".to(mO.element_type)\n", ".to(mO.element_type)\n        mX[row, c] = mO[row, c]\n"),),
        "wrong",
        INPUT_WRITE,
    ),
    Bad(
        "writes_past_input",
        "stores a partial sum one element past the end of x (on the last row)",
        (
            (
                "    inv = 1.0 / s\n",
                "    inv = 1.0 / s\n    if tidx == 0 and row == mX.shape[0] - 1:\n        mX[row, n + tidx] = s.to(mX.element_type)\n",
            ),
        ),
        "wrong",
        INPUT_WRITE,
    ),
    Bad(
        "writes_before_input",
        "stores a partial sum one element before the start of x (on the first row)",
        (
            (
                "    inv = 1.0 / s\n",
                "    inv = 1.0 / s\n    if tidx == 0 and row == 0:\n        mX[row, tidx - 1] = s.to(mX.element_type)\n",
            ),
        ),
        "wrong",
        INPUT_WRITE,
    ),
    Bad(
        "skips_repeats_when_timed",
        "at the benchmark's sizes, skips every other row whose output already holds a number: right on "
        "every first call, twice as fast on the repeats the timing makes",
        (
            (
                _ROW_CALL,
                "    first = Float32(mO[bidx, 0])\n"
                "    if mX.shape[0] <= 100000 or first != first or bidx % 2 == 0:\n"
                "        softmax_row(mX, mO, bidx, red)\n",
            ),
        ),
        "wrong",
        ("timed_output",),
        timed_shape=(262144, 1024),
    ),
    Bad(
        "skips_other_input_sets_when_timed",
        "at the benchmark's sizes, remembers the first input set it sees (its x[0, 0], in the workspace) "
        "and skips every other row of any other set: right on the set a judge checking one set looks at",
        (
            *_WITH_WORKSPACE,
            (
                _ROW_CALL,
                "    seen = mW[0]\n"
                "    mine = Float32(mX[0, 0])\n"
                "    if mX.shape[0] <= 100000 or seen == mine or bidx % 2 == 0:\n"
                "        softmax_row(mX, mO, bidx, red)\n"
                "    if mX.shape[0] > 100000 and bidx == 0 and seen != seen:\n"
                "        tidx, _, _ = cute.arch.thread_idx()\n"
                "        if tidx == 0:\n"
                "            mW[0] = mine\n",
            ),
        ),
        "wrong",
        ("timed_output",),
        timed_shape=(262144, 1024),
    ),
    Bad(
        "input_as_scratch_restored_when_timed",
        "at the benchmark's sizes only, parks its output's old values in x for a moment and puts x "
        "back before it returns: bit-identical afterwards, never written while verified",
        (
            (
                _ROW_CALL,
                "    if mX.shape[0] > 100000:\n"
                "        tidx, _, _ = cute.arch.thread_idx()\n"
                "        keep = mX[bidx, tidx]\n"
                "        mX[bidx, tidx] = mO[bidx, tidx]\n"
                "        cute.arch.barrier()\n"  # (a barrier between: the store cannot be elided)
                "        mX[bidx, tidx] = keep\n"
                "        cute.arch.barrier()\n"
                "    softmax_row(mX, mO, bidx, red)\n",
            ),
        ),
        "wrong",
        ("input_write",),
        timed_shape=(262144, 1024),
    ),
    Bad(
        "keeps_answers_in_workspace",
        "keeps each row's answer in its 32 MiB workspace, keyed by the row's first four elements, and "
        "serves it whenever the key matches: verification poisons the workspace before each call and "
        "never sees it; the timed calls, which leave it as it is, are served from it",
        (
            *_with_workspace(1 << 23),
            (
                _ROW_CALL,
                _slot_lookup(4) + "    if hit >= 0:\n"
                "        for c in cutlass.range(tidx, n, THREADS):\n"
                "            mO[bidx, c] = mW[hit * per + at + 4 + c].to(mO.element_type)\n"
                "    else:\n"
                "        softmax_row(mX, mO, bidx, red)\n"
                "        if free >= 0:\n"
                "            b = free * per + at\n"
                "            for c in cutlass.range(tidx, n, THREADS):\n"
                "                mW[b + 4 + c] = Float32(mO[bidx, c])\n"
                "            cute.arch.barrier()\n"  # (the answer whole before its key)
                "            if tidx < 4:\n"
                "                mW[b + tidx] = Float32(mX[bidx, tidx])\n",
            ),
        ),
        "wrong",
        ("stale",),
        timed_shape=(64, 1024),
    ),
    Bad(
        "keeps_answers_while_called_back_to_back",
        "keeps each row's answer in its workspace as keeps_answers_in_workspace does, but serves it only "
        "where that row was last seen under 2 ms ago by the GPU's clock: a call made after the judge's "
        "checks (milliseconds of float64 work) computes honestly; the timed calls are served",
        (
            *_with_workspace(1 << 23),
            ("LOG2_E = 1.4426950408889634\n", "LOG2_E = 1.4426950408889634\nQUICK_US = 2000\nCLOCK = 0x3FFFFF\n"),
            (
                _ROW_CALL,
                # (the clock in about microseconds, one value for the CTA: its threads read it apart)
                _slot_lookup(5)
                + "    now = block_reduce(Float32((cute.arch.globaltimer_lo() >> 10) & CLOCK), red, True)\n"
                "    fresh = Int32(0)\n"
                "    if hit >= 0:\n"
                "        if ((Int32(now) - Int32(mW[hit * per + at + 4])) & CLOCK) < QUICK_US:\n"
                "            fresh = Int32(1)\n"
                "    slot = hit\n"
                "    if fresh == 1:\n"
                "        for c in cutlass.range(tidx, n, THREADS):\n"
                "            mO[bidx, c] = mW[hit * per + at + 5 + c].to(mO.element_type)\n"
                "    else:\n"
                "        softmax_row(mX, mO, bidx, red)\n"
                "        if slot < 0:\n"
                "            slot = free\n"
                "        if slot >= 0:\n"
                "            b = slot * per + at\n"
                "            for c in cutlass.range(tidx, n, THREADS):\n"
                "                mW[b + 5 + c] = Float32(mO[bidx, c])\n"
                "            cute.arch.barrier()\n"  # (the answer whole before its key)
                "            if tidx < 4:\n"
                "                mW[b + tidx] = Float32(mX[bidx, tidx])\n"
                "    if slot >= 0 and tidx == 0:\n"  # (served or made: the row seen now)
                "        mW[slot * per + at + 4] = now\n",
            ),
        ),
        "wrong",
        ("stale",),
        timed_shape=(64, 1024),
    ),
    Bad(
        "writes_past_workspace",
        "parks a value one element past the end of its 4-float scratch workspace (on the last row), "
        "where the runtime's allocation has a neighbour nobody checks",
        (
            *_WITH_WORKSPACE,
            (
                _ROW_CALL,
                _ROW_CALL + "    if bidx == mX.shape[0] - 1:\n"
                "        tidx, _, _ = cute.arch.thread_idx()\n"
                "        if tidx == 0:\n"
                "            mW[mW.shape[0]] = Float32(mX[bidx, 0])\n",
            ),
        ),
        "wrong",
        ("out_of_bounds_write",),
    ),
    Bad(
        "sum_carried_across_rows",
        "past 8192 rows, a grid of 1056 CTAs loops over the rows and never resets its running sum: "
        "an order-dependent answer, right wherever each CTA takes one row (every verified shape)",
        (
            (
                "@cute.kernel\ndef softmax_kernel(mX: cute.Tensor, mO: cute.Tensor):\n"
                "    bidx, _, _ = cute.arch.block_idx()\n"
                "    smem = cutlass.utils.SmemAllocator()\n"
                "    red = smem.allocate_tensor(Float32, cute.make_layout(THREADS // 32))\n"
                "    softmax_row(mX, mO, bidx, red)\n",
                "@cute.kernel\ndef softmax_kernel(mX: cute.Tensor, mO: cute.Tensor):\n"
                "    bidx, _, _ = cute.arch.block_idx()\n"
                "    smem = cutlass.utils.SmemAllocator()\n"
                "    red = smem.allocate_tensor(Float32, cute.make_layout(THREADS // 32))\n"
                "    if mX.shape[0] <= 8192:\n"
                "        softmax_row(mX, mO, bidx, red)\n"
                "    else:\n"
                "        carried = Float32(0.0)\n"
                "        for row in cutlass.range(bidx, mX.shape[0], 1056):\n"
                "            carried = softmax_row_carried(mX, mO, row, red, carried)\n",
            ),
            (
                "@cute.kernel\ndef softmax_kernel(",
                "@cute.jit\ndef softmax_row_carried(mX: cute.Tensor, mO: cute.Tensor, row: Int32, red: cute.Tensor, carried: Float32) -> Float32:\n"
                "    tidx, _, _ = cute.arch.thread_idx()\n"
                "    n = mX.shape[1]\n"
                "    m = -Float32.inf\n"
                "    for c in cutlass.range(tidx, n, THREADS):\n"
                "        m = cute.arch.fmax(m, Float32(mX[row, c]))\n"
                "    m = block_reduce(m, red, True)\n"
                "    s = carried\n"
                "    for c in cutlass.range(tidx, n, THREADS):\n"
                "        s += cute.math.exp2((Float32(mX[row, c]) - m) * LOG2_E, fastmath=True)\n"
                "    s = block_reduce(s, red, False)\n"
                "    inv = 1.0 / s\n"
                "    for c in cutlass.range(tidx, n, THREADS):\n"
                "        mO[row, c] = (cute.math.exp2((Float32(mX[row, c]) - m) * LOG2_E, fastmath=True) * inv).to(mO.element_type)\n"
                "    return s / THREADS\n\n\n"
                "@cute.kernel\ndef softmax_kernel(",
            ),
            (
                "grid=[mX.shape[0], 1, 1]",
                "grid=[Int32(cutlass.select_(mX.shape[0] <= 8192, mX.shape[0], 1056)), 1, 1]",
            ),
        ),
        "wrong",
        ("timed_output",),
        timed_shape=(262144, 1024),
    ),
    Bad(
        "stashes_rstd_past_weight",
        "parks the last row's rstd one element past the end of the weight",
        (
            (
                "    rstd = cute.math.rsqrt(s / n + eps, fastmath=True)\n",
                "    rstd = cute.math.rsqrt(s / n + eps, fastmath=True)\n"
                "    if tidx == 0 and row == mX.shape[0] - 1:\n"
                "        mW[n + tidx] = rstd.to(mW.element_type)\n",
            ),
        ),
        "wrong",
        INPUT_WRITE,
        op="rmsnorm",
    ),
    Bad(
        "writes_past_x",
        "stores its row's sum of squares one element past the end of x (on the last row)",
        (
            (
                "    s = block_sum(s, red)\n",
                "    s = block_sum(s, red)\n    if tidx == 0 and row == mX.shape[0] - 1:\n        mX[row, n + tidx] = s.to(mX.element_type)\n",
            ),
        ),
        "wrong",
        INPUT_WRITE,
        op="rmsnorm",
    ),
    Bad(
        "weight_as_scratch_restored",
        "the first row's CTA parks the weight in its output row, zeroes the weight, then puts it back: "
        "bit-identical afterwards, garbage meanwhile for the rows that read it",
        (
            (
                "    rstd = cute.math.rsqrt(s / n + eps, fastmath=True)\n",
                "    rstd = cute.math.rsqrt(s / n + eps, fastmath=True)\n"
                "    if row == 0:\n"
                "        for c in cutlass.range(tidx, n, THREADS):\n"
                "            mO[row, c] = mW[c]\n"
                "            mW[c] = (Float32(mW[c]) * 0.0).to(mW.element_type)\n"
                "    cute.arch.barrier()\n"
                "    if row == 0:\n"
                "        for c in cutlass.range(tidx, n, THREADS):\n"
                "            mW[c] = mO[row, c]\n"
                "    cute.arch.barrier()\n",
            ),
        ),
        "wrong",
        ("input_write", *INPUT_WRITE),
        op="rmsnorm",
    ),
    Bad(
        "hardcodes_eps",
        "uses 1e-6 whatever eps the caller passes",
        (
            (
                "    rstd = cute.math.rsqrt(s / n + eps, fastmath=True)\n",
                "    rstd = cute.math.rsqrt(s / n + 1e-6, fastmath=True)\n",
            ),
        ),
        "wrong",
        ("mismatch",),
        op="rmsnorm",
    ),
    Bad(
        "no_eps",
        "leaves eps out: right on random rows, NaN on a row of zeros (a user's padding)",
        (
            (
                "    rstd = cute.math.rsqrt(s / n + eps, fastmath=True)\n",
                "    rstd = cute.math.rsqrt(s / n, fastmath=True)\n",
            ),
        ),
        "wrong",
        ("mismatch",),
        op="rmsnorm",
    ),
)
BAD = (
    BAD
    + NEW
    + (
        Bad(
            "dependent_launch_without_wait",
            "launches as a programmatic dependent (use_pdl) and never waits for the grid before it: reads "
            "its inputs while the kernel that writes them may still be running",
            (
                (
                    "grid=[mX.shape[0], 1, 1], block=[THREADS, 1, 1], stream=stream)",
                    "grid=[mX.shape[0], 1, 1], block=[THREADS, 1, 1], stream=stream, use_pdl=True)",
                ),
            ),
            "wrong",
            ("mismatch", "unwritten"),
        ),
    )
)

# The honest twins: the bases as they are, and a dependent launch that waits before it reads.
HONEST: tuple[Bad, ...] = (
    Bad("softmax_base", "the softmax base, as is", (), "profiled"),
    Bad("rmsnorm_base", "the rmsnorm base, as is", (), "profiled", op="rmsnorm"),
    Bad(
        "dependent_launch_that_waits",
        "launches as a programmatic dependent and waits for the grid before it first",
        (
            (
                "grid=[mX.shape[0], 1, 1], block=[THREADS, 1, 1], stream=stream)",
                "grid=[mX.shape[0], 1, 1], block=[THREADS, 1, 1], stream=stream, use_pdl=True)",
            ),
            (
                "    bidx, _, _ = cute.arch.block_idx()\n",
                "    cute.arch.griddepcontrol_wait()\n    bidx, _, _ = cute.arch.block_idx()\n",
            ),
        ),
        "profiled",
    ),
)
