"""Compiled kernels at run time: as torch functions, sealed, shipped and loaded.

compiled.py     the reference kernels as torch functions (`llmcompile.kernels` is the public face)
callpath.py     a call's host path: checked once per (dtype, N), then straight to the kernel
callspec.py     what calling an op needs to know (its tensors, scalars, dtypes), from a spec or a manifest
plans.py        a flat-rows op's plan at one (dtype, N) and the fast calls made of it
fixed_layout.py attention's call forms: SDPA's 4-D tensors, a strided v, the calls its C++ node keeps
native_call.c   the eager call in C (built once per machine; native_call.py builds and binds it)
autograd.py     forward kernels saving what the backward kernels read
launches.py     a compiled module's launches: grid, threads, shared memory
seal.py         a host module -> one audited object file (runs only in trusted processes)
artifact.py     the artifact on disk: manifest.json + one object per N, hashed
library.py      an artifact's objects linked into kernels.so (with runtime_shim.c)
loader.py       an artifact as a torch function, without CuTe DSL where it is linked
export.py       `llmcompile export`: a reference kernel or a run's best as an artifact
"""
