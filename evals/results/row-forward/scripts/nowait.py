"""The back-to-back test with the dependent launch's wait taken out: does it catch the race?"""

import sys

import pytest

import reference_kernels.reduce as R

R.await_previous_grid = lambda tiling: None
sys.exit(pytest.main(["-q", "-p", "no:cacheprovider", "-m", "gpu", "tests/test_kernels_gpu.py", "-k", "back_to_back"]))
