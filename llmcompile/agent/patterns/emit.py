"""Expressions: an elementwise subgraph written as the CuTe-DSL code a template's jinja inlines."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import fx

from llmcompile.agent.patterns.graph import BINARY, CASTS, COMPARISONS, PARAMS, UNARY, VIEWS, Op, Unsupported, op_of


def lit(v: Any) -> str:
    if isinstance(v, bool):
        return repr(v)
    if isinstance(v, (int, float)):
        if math.isnan(v):
            return "math.nan"
        return ("-math.inf" if v < 0 else "math.inf") if math.isinf(v) else repr(float(v))
    if isinstance(v, str):
        return repr(v)
    raise Unsupported(f"constant {v!r}")


def _params(op: Op, start: int) -> dict[str, Any]:
    """An elementwise function's parameters (PARAMS), by keyword or by position from `start`,
    torch's defaults where not given."""
    return {
        name: op.kw.get(name, op.args[start + i] if len(op.args) > start + i else default)
        for i, (name, default) in enumerate(PARAMS.get(op.kind, ()))
    }


def _param_args(op: Op, start: int) -> list[str]:
    """Named parameters of an elementwise function as literals, positional ones included."""
    defaults = dict(PARAMS.get(op.kind, ()))
    return [f"{name}={lit(v)}" for name, v in _params(op, start).items() if v != defaults[name]]


class Emitter:
    """Expressions in CuTe DSL for elementwise nodes. `vector`: operands are fp32 TensorSSA
    vectors (the map template, where M.* functions apply); else fp32 scalars (a reduction's
    prologue and epilogue: arithmetic and cute.math only)."""

    def __init__(self, gm: fx.GraphModule, env: dict[fx.Node, str], vector: bool) -> None:
        self.gm, self.env, self.vector = gm, env, vector

    def expr(self, a: Any) -> str:
        if isinstance(a, fx.Node):
            if a in self.env:
                return self.env[a]
            self.env[a] = self._node(a)
            return self.env[a]
        return lit(a)

    def _node(self, node: fx.Node) -> str:
        op = op_of(self.gm, node)
        k = op.kind
        if k in VIEWS:
            return self.expr(op.args[0])
        if k in CASTS:
            to = op.kw.get("dtype", op.args[1] if len(op.args) > 1 else None)
            if isinstance(to, torch.dtype) and not to.is_floating_point:
                raise Unsupported(f"a cast to {to}")
            return self.expr(op.args[0])
        if k in BINARY:
            a, b = (self.expr(x) for x in op.args[:2])
            if k == "pow":
                p = op.args[1]
                if not isinstance(p, (int, float)):
                    raise Unsupported("a power with a tensor exponent")
                if self.vector:
                    return f"M.power({a}, {lit(p)})"
                if float(p).is_integer() and 1 <= p <= 4:
                    return "(" + " * ".join([a] * int(p)) + ")"
                return f"cute.math.pow({a}, Float32({lit(p)}))"
            sym = {"mul": "*", "add": "+", "sub": "-", "truediv": "/"}[k]
            if k == "add" and "alpha" in op.kw:
                b = f"({b} * {lit(op.kw['alpha'])})"
            return f"({a} {sym} {b})"
        if (k in COMPARISONS or k in ("isnan", "where")) and self.vector:
            raise Unsupported(f"`{k}` outside a reduction (a mask written out)")
        if k in COMPARISONS:
            a, b = (self.expr(x) for x in op.args[:2])
            return f"cutlass.select_({a} {COMPARISONS[k]} {b}, Float32(1.0), Float32(0.0))"
        if k == "isnan":
            x = self.expr(op.args[0])
            return f"cutlass.select_({x} != {x}, Float32(1.0), Float32(0.0))"
        if k == "where":
            if len(op.args) != 3 or op.kw:
                raise Unsupported("`where` with other than (condition, input, other) by position")
            args = op.args if op.node.op == "call_function" else [op.args[1], op.args[0], op.args[2]]  # x.where(c, y)
            c, a, b = (self.expr(x) if isinstance(x, fx.Node) else f"Float32({lit(x)})" for x in args)
            return f"cutlass.select_({c} != Float32(0.0), {a}, {b})"
        if k in UNARY:
            x = self.expr(op.args[0])
            if k == "neg":
                return f"(-{x})"
            if self.vector:
                return f"M.{k}({', '.join([x, *_param_args(op, 1)])})"
            return _scalar_unary(op, x)
        if k == "clamp":
            lo = op.kw.get("min", op.args[1] if len(op.args) > 1 else None)
            hi = op.kw.get("max", op.args[2] if len(op.args) > 2 else None)
            if not self.vector:
                x = self.expr(op.args[0])
                if lo is not None:
                    x = f"cute.arch.fmax({x}, Float32({lit(lo)}))"
                if hi is not None:
                    x = f"cute.arch.fmin({x}, Float32({lit(hi)}))"
                return x
            return f"M.hardtanh({self.expr(op.args[0])}, {lit(-math.inf if lo is None else lo)}, {lit(math.inf if hi is None else hi)})"
        raise Unsupported(f"`{k}`")


# The map template's functions (reference_kernels/map.py) on one fp32 value, for a reduction's
# prologue and epilogue: {x} the operand, the others the function's parameters (PARAMS)
_SCALAR: dict[str, str] = {
    "abs": "cute.math.abs({x})",
    "exp": "cute.math.exp({x})",
    "log": "cute.math.log({x})",
    "sqrt": "cute.math.sqrt({x})",
    "rsqrt": "cute.math.rsqrt({x})",
    "relu": "cute.arch.fmax({x}, Float32(0.0))",
    "sigmoid": "(Float32(1.0) / (Float32(1.0) + cute.math.exp(-{x})))",
    "silu": "({x} / (Float32(1.0) + cute.math.exp(-{x})))",
    "tanh": "cute.math.tanh({x})",
    "softsign": "({x} / (Float32(1.0) + cute.math.abs({x})))",
    "hardsigmoid": "cute.arch.fmin(cute.arch.fmax({x} * Float32(1.0 / 6.0) + Float32(0.5), Float32(0.0)), Float32(1.0))",
    "hardtanh": "cute.arch.fmin(cute.arch.fmax({x}, Float32({min_val})), Float32({max_val}))",
    "leaky_relu": "cutlass.select_({x} > Float32(0.0), {x}, {x} * Float32({negative_slope}))",
    "elu": "cutlass.select_({x} > Float32(0.0), {x}, Float32({alpha}) * cute.math.expm1({x}))",
    "selu": "(Float32(1.0507009873554805) * cutlass.select_({x} > Float32(0.0), {x}, "
    "Float32(1.6732632423543772) * cute.math.expm1({x})))",
    "softplus": "cutlass.select_({x} * Float32({beta}) > Float32({threshold}), {x}, "
    "cute.math.log1p(cute.math.exp({x} * Float32({beta}))) * Float32(1.0 / {beta}))",
}
_GELU = {
    "none": "(Float32(0.5) * {x} * (Float32(1.0) + cute.math.erf({x} * Float32(0.7071067811865476))))",
    "tanh": "(Float32(0.5) * {x} * (Float32(1.0) + cute.math.tanh(Float32(0.7978845608028654) * "
    "({x} + Float32(0.044715) * {x} * {x} * {x}))))",
}


def _scalar_unary(op: Op, x: str) -> str:
    params = _params(op, 1)
    if op.kind == "gelu":
        if params["approximate"] not in _GELU:
            raise Unsupported(f"`gelu` with approximate={params['approximate']!r}")
        return _GELU[params["approximate"]].format(x=x)
    if op.kind not in _SCALAR:
        raise Unsupported(f"`{op.kind}` around a reduction")
    return _SCALAR[op.kind].format(x=x, **{k: lit(v) for k, v in params.items()})
