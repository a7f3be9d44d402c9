"""llmcompile: an agent that writes CuTe-DSL GPU kernels and judges them against the memory speed of light."""

__version__ = "0.1.0"
