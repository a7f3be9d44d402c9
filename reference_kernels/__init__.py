"""Hand-written CuTe-DSL reference kernels, all in the one kernel contract (see llmcompile.specs.contract)."""
