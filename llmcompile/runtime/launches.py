"""What a compiled kernel module launches, read from its host code: each kernel's threads per CTA
and dynamic shared memory where they are constants; and whether a launch can run at all (an
sm_90 CTA's shared memory). Both the judge's sealing and the runtime's own compiles ask."""

from __future__ import annotations

import re
from typing import Any

# The host side of a CuTe DSL launch, in the compiled module's LLVM dialect: constants stored
# into the fields of the launch config struct (grid, block, dynamic smem bytes, stream, ...).
_LAUNCH_STRUCT = "!llvm.struct<(array<3 x i32>, array<3 x i32>, i64, ptr, ptr, i32)>"
_IR_CONST = re.compile(r"(%\w+) = llvm\.mlir\.constant\((\d+) : i(?:32|64)\)")
_IR_FIELD = re.compile(
    r"(%\w+) = llvm\.getelementptr %\w+\[0, (\d+)(?:, (\d+))?\] : \(!llvm\.ptr\) -> !llvm\.ptr, (.+)$"
)
_IR_STORE = re.compile(r"llvm\.store (%\w+), (%\w+) :")
_IR_KERNEL = re.compile(r"llvm\.mlir\.addressof @kernels_(kernel_\w+)")


def short_name(name: str) -> str:
    return re.sub(r"^kernel_cutlass_", "", name)[:60]


def parse_launches(ir_text: str) -> dict[str, tuple[int, int]]:
    """(threads per CTA, dynamic shared-memory bytes) of each kernel the host code launches
    with constants, from the compiled module's text; kernels launched with computed values
    are left out rather than guessed."""
    launches: dict[str, tuple[int, int]] = {}
    for body in ir_text.split("llvm.func @")[1:]:
        consts: dict[str, int] = {}
        fields: dict[str, tuple[int, int | None]] = {}
        stored: dict[tuple[int, int | None], int] = {}
        kernel = None
        for line in body.splitlines():
            if m := _IR_CONST.search(line):
                consts[m.group(1)] = int(m.group(2))
            elif (m := _IR_FIELD.search(line)) and m.group(4).strip() == _LAUNCH_STRUCT:
                fields[m.group(1)] = (int(m.group(2)), int(m.group(3)) if m.group(3) else None)
            elif (m := _IR_STORE.search(line)) and m.group(2) in fields and m.group(1) in consts:
                stored[fields[m.group(2)]] = consts[m.group(1)]
            elif m := _IR_KERNEL.search(line):
                kernel = m.group(1)
        block = [stored.get((1, i)) for i in range(3)]
        if kernel and (2, None) in stored and None not in block:
            launches[short_name(kernel)] = (block[0] * block[1] * block[2], stored[(2, None)])
    return launches


# The most shared memory one CTA may opt into on sm_90 (H100 and H200 alike).
MAX_SMEM_PER_CTA = 232448


def launches_of(compiled: Any) -> dict[str, tuple[int, int]]:
    """`parse_launches` of a compiled function's module (empty when it carries none)."""
    return parse_launches(str(getattr(compiled, "ir_module", "")))


def check_launchable(launches: dict[str, tuple[int, int]]) -> None:
    """Raise ValueError when a launch asks for more shared memory than a CTA may have: the
    launch would fail on the GPU, or leave the outputs unwritten, so say so at compile time."""
    for name, (_, smem) in launches.items():
        if smem > MAX_SMEM_PER_CTA:
            raise ValueError(
                f"kernel {name} asks for {smem} B of shared memory per CTA; sm_90 allows at most "
                f"{MAX_SMEM_PER_CTA} B (227 KB): stage or keep less in shared memory"
            )
