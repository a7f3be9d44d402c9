"""The knob sweep's table overrides (CPU): a variant's table replaces the module's for that
variant only, and the module's own comes back even when the variant fails to compile."""

from __future__ import annotations

import pytest

from evals import sweep_knobs
from reference_kernels import rmsnorm_bwd


def test_table_override_is_scoped_to_the_variant() -> None:
    before = rmsnorm_bwd.CTAS_PER_SM
    with sweep_knobs._tables({"rmsnorm_bwd.CTAS_PER_SM": [[None, 2]]}):
        assert rmsnorm_bwd.CTAS_PER_SM == ((None, 2),)
    assert rmsnorm_bwd.CTAS_PER_SM is before
    with pytest.raises(RuntimeError), sweep_knobs._tables({"rmsnorm_bwd.CTAS_PER_SM": [[1024, 8], [None, 1]]}):
        assert rmsnorm_bwd.CTAS_PER_SM == ((1024, 8), (None, 1))
        raise RuntimeError("does not compile")
    assert rmsnorm_bwd.CTAS_PER_SM is before


def test_unknown_table_is_an_error() -> None:
    with pytest.raises(AttributeError), sweep_knobs._tables({"rmsnorm_bwd.NO_SUCH_TABLE": [[None, 1]]}):
        pass
