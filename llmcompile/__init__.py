"""llmcompile: an agent that writes CuTe-DSL GPU kernels and judges them against the memory speed of light."""

__version__ = "0.1.0"

# the CLI's subcommands; here, where the entry reads them before anything imports torch
COMMANDS = ("list", "doctor", "bench", "check", "run", "eval", "export", "coverage")
