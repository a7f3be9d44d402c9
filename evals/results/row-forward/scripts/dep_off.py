"""dep_off.py args...: llmcompile's CLI with reduce.DEPENDENT_LAUNCH off (every row kernel a plain launch)."""

import sys

import reference_kernels.reduce as R
from llmcompile.cli import main

R.DEPENDENT_LAUNCH = ((None, False),)
sys.exit(main(sys.argv[1:]))
