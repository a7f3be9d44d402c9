"""Stage 1: read the candidate's source without running it.

The kernel contract allows CuTe DSL and a few pure-Python helpers, nothing else. Everything
that could let a candidate compute the answer on the host, look at the judge, or escape the
sandbox (torch, numpy, files, processes, sockets, dynamic imports or code) is refused here,
before any of it executes.
"""

from __future__ import annotations

import ast

from llmcompile.harness.verdict import StaticResult
from llmcompile.specs.contract import ENTRY

MAX_BYTES = 64_000
MAX_LINES = 1_500

# Templates whose kernels a module may instantiate instead of writing its own `@cute.kernel`.
PATTERN_TEMPLATES = (
    "reference_kernels.map",
    "reference_kernels.strided",
    "reference_kernels.leading",
    "reference_kernels.scan",
    "reference_kernels.scan_columns",  # a scan along another dim than the last
    "reference_kernels.total",
    "reference_kernels.norm",
    "reference_kernels.pool",
    "reference_kernels.cross_entropy",  # the rows' losses of a reduced cross-entropy
    "reference_kernels.cross_entropy_total",  # and their sum, mean over the kept rows and 1/kept
    "reference_kernels.softmax",  # a softmax of a longer input, as rows
    "reference_kernels.log_softmax",
    "reference_kernels.softmax_bwd",  # a softmax backward, or with log-softmax's combine
    "reference_kernels.rmsnorm",  # a norm's forward that also saves its statistics
    "reference_kernels.layernorm",
    "reference_kernels.rmsnorm_bwd",  # a norm's backward, or with LayerNorm's mean and db
    "reference_kernels.layernorm_bwd",  # LayerNorm's backward with its own tables (and for one dy value)
    "reference_kernels.attention",  # attention forward, causal or not
    "reference_kernels.attention_tf32",  # fp32 attention for wide heads (two phases, TF32 MMA)
)
ALLOWED_MODULES = (
    "__future__",
    "cutlass",
    "cuda.bindings",
    "math",
    "functools",
    "operator",
    "typing",
    "dataclasses",
    "reference_kernels.reduce",  # the row template, and its parts:
    "reference_kernels.row_plan",
    "reference_kernels.row_io",
    "reference_kernels.tuning",  # the tuned tables (data) the templates read
    "reference_kernels.attention_softmax",  # the online softmax on attention's accumulators
    *PATTERN_TEMPLATES,
)
# Names that reach outside the kernel: reading them anywhere (an attribute such as
# `cutlass.torch`, a builtin call) is refused, not just importing them.
FORBIDDEN_NAMES = frozenset(
    {
        "torch",
        "numpy",
        "np",
        "triton",
        "cupy",
        "ctypes",
        "subprocess",
        "os",
        "sys",
        "socket",
        "shutil",
        "pathlib",
        "importlib",
        "builtins",
        "pickle",
        "open",
        "exec",
        "eval",
        "compile",
        "__import__",
        "globals",
        "locals",
        "vars",
        "breakpoint",
        "input",
        "memoryview",
        "from_dlpack",
        # attributes named by a string built at run time reach anything (`"tor" + "ch"`)
        "getattr",
        "setattr",
        "delattr",
        "attrgetter",
        "methodcaller",
        "get_type_hints",  # evaluates strings
        "ForwardRef",
        # CuTe DSL's doors back to the host: its torch bridge, runtime loaders, raw MLIR
        "runtime",
        "load_module",
        "_mlir",
    }
)
ALLOWED_DUNDERS = frozenset({"__init__", "__call__", "__name__", "__future__", "__post_init__"})


def _module_allowed(name: str) -> bool:
    if any(part in FORBIDDEN_NAMES for part in name.split(".")):
        return False  # `cutlass.torch` starts with an allowed name and is torch
    return any(name == a or name.startswith(a + ".") for a in ALLOWED_MODULES)


def _is_kernel_decorator(dec: ast.expr) -> bool:
    target = dec.func if isinstance(dec, ast.Call) else dec
    return isinstance(target, ast.Attribute) and target.attr == "kernel"


def check_source(source: str) -> StaticResult:
    problems: list[str] = []
    if len(source.encode()) > MAX_BYTES or source.count("\n") > MAX_LINES:
        return StaticResult(False, [f"source is larger than the limit ({MAX_BYTES} bytes, {MAX_LINES} lines)"])
    try:
        tree = ast.parse(source)
    except SyntaxError as e:
        return StaticResult(False, [f"line {e.lineno}: syntax error: {e.msg}"])

    has_entry = has_kernel = False
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name == ENTRY:
            has_entry = True
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            has_entry |= any(isinstance(t, ast.Name) and t.id == ENTRY for t in targets)

    for node in ast.walk(tree):
        line = getattr(node, "lineno", "?")
        if isinstance(node, ast.Import):
            for a in node.names:
                if not _module_allowed(a.name):
                    problems.append(f"line {line}: import of `{a.name}` is not allowed")
        elif isinstance(node, ast.ImportFrom):
            mod = "." * node.level + (node.module or "")
            full = [f"{mod}.{a.name}" for a in node.names]
            named = any(a.name in FORBIDDEN_NAMES for a in node.names)
            if node.level or named or not (_module_allowed(mod) or all(_module_allowed(f) for f in full)):
                problems.append(f"line {line}: import from `{mod}` is not allowed")
            # a module that instantiates a pattern template launches the template's kernel
            has_kernel |= any(f in PATTERN_TEMPLATES for f in full) or mod in PATTERN_TEMPLATES
        elif isinstance(node, ast.Name) and node.id in FORBIDDEN_NAMES:
            problems.append(f"line {line}: `{node.id}` is not allowed in a kernel module")
        elif isinstance(node, ast.Attribute):
            if node.attr in FORBIDDEN_NAMES:
                problems.append(f"line {line}: `.{node.attr}` is not allowed in a kernel module")
            elif node.attr.startswith("__") and node.attr not in ALLOWED_DUNDERS:
                problems.append(f"line {line}: access to `{node.attr}` is not allowed")
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            has_kernel |= any(_is_kernel_decorator(d) for d in node.decorator_list)
        elif isinstance(node, (ast.Global, ast.Nonlocal)):
            problems.append(f"line {line}: `global`/`nonlocal` state is not allowed (kernels keep no state)")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and "__" in node.value:
            if any(f in node.value for f in ("__import__", "__builtins__", "__globals__", "__subclasses__")):
                problems.append(f"line {line}: string naming interpreter internals is not allowed")

    if not has_entry:
        problems.append(f"no module-level `{ENTRY}` (the kernel contract's @cute.jit entry)")
    if not has_kernel:
        problems.append("no `@cute.kernel` function (nor a pattern template imported to instantiate)")
    # keep the report short and stable: first occurrence of each message
    unique = list(dict.fromkeys(problems))
    return StaticResult(not unique, unique[:20])
