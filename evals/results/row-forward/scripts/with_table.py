"""with_table.py MODE args...: llmcompile's CLI with cross_entropy.GRID_DEPENDENCY set to MODE.

(The experiment's tree only: a cross-entropy table of "off", "wait" and "early". The kept
code is reduce.DEPENDENT_LAUNCH, "wait" for every row kernel; see the README.)
"""

import sys

import reference_kernels.cross_entropy as ce
from llmcompile.cli import main

ce.GRID_DEPENDENCY = ((None, sys.argv[1]),)
sys.exit(main(sys.argv[2:]))
