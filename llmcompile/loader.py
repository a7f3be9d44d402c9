"""`load(directory)`: a kernel artifact (a run's `best/`, or what `llmcompile export` wrote) as a
torch function and a torch.library op; without CuTe DSL where it has a linked library
(`runtime/loader.py`)."""

from llmcompile.runtime.loader import load

__all__ = ["load"]
