"""CPU (CI): what calling a kernel needs to know of its op (`runtime/callspec.py`)."""

from __future__ import annotations

import json

from llmcompile.runtime.callspec import CallSpec, schema
from llmcompile.specs import get_op


def test_a_call_spec_round_trips_through_a_manifest() -> None:
    for op in ("softmax", "rmsnorm", "layernorm", "cross_entropy"):
        call = CallSpec.of(get_op(op))
        assert CallSpec.from_json(json.loads(json.dumps(call.to_json()))) == call
    assert schema(CallSpec.of(get_op("cross_entropy"))) == (
        "(Tensor x, Tensor target, Tensor(a0!) loss, int ignore_index) -> ()"
    )
