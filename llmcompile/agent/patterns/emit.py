"""Expressions: an elementwise subgraph written as the CuTe-DSL code a template's jinja inlines."""

from __future__ import annotations

import math
from typing import Any

from torch import fx

from llmcompile.agent.patterns.graph import BINARY, PARAMS, UNARY, VIEWS, Op, Unsupported, op_of


def lit(v: Any) -> str:
    if isinstance(v, bool):
        return repr(v)
    if isinstance(v, (int, float)):
        return ("-math.inf" if v < 0 else "math.inf") if math.isinf(v) else repr(float(v))
    if isinstance(v, str):
        return repr(v)
    raise Unsupported(f"constant {v!r}")


def _param_args(op: Op, start: int) -> list[str]:
    """Named parameters of an elementwise function as literals, positional ones included."""
    out = []
    for i, (name, default) in enumerate(PARAMS.get(op.kind, ())):
        v = op.kw.get(name, op.args[start + i] if len(op.args) > start + i else default)
        if v != default:
            out.append(f"{name}={lit(v)}")
    return out


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
        if k in UNARY:
            x = self.expr(op.args[0])
            if k == "neg":
                return f"(-{x})"
            if self.vector:
                return f"M.{k}({', '.join([x, *_param_args(op, 1)])})"
            scalar = {"abs": "cute.math.abs", "exp": "cute.math.exp", "log": "cute.math.log"}
            scalar |= {"sqrt": "cute.math.sqrt", "rsqrt": "cute.math.rsqrt"}
            if k not in scalar:
                raise Unsupported(f"`{k}` around a reduction")
            return f"{scalar[k]}({x})"
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
