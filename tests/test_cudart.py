"""runtime/cudart.py: CuTe DSL's JIT kernels bound to the library over torch's CUDA runtime.
CPU (CI): the library over a stand-in libcudart, and which library the JIT binds a compiled
kernel's host code to, read from the JIT's own memory. GPU: the reference kernels through it."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from llmcompile.runtime import cudart, library

ROOT = Path(__file__).resolve().parents[1]
needs_cc = pytest.mark.skipif(shutil.which("cc") is None or shutil.which("nm") is None, reason="needs cc and nm")

# Which library each runtime entry of compiled kernel `fn`'s host code is bound to, of `libs`: the
# JIT keeps the absolute addresses of what it bound near the code it loaded.
SCAN = """
entry = fn.engine.lookup("__tvm_ffi_" + fn.function_name)
addresses = {}
for lib in libs:
    handle = ctypes.CDLL(str(lib))
    for name in ("_cudaLaunchKernelEx", "_cudaGetDevice", "cuda_dialect_init_library_once"):
        addresses[ctypes.cast(getattr(handle, name), ctypes.c_void_p).value] = (lib.name, name)
found = set()
for line in open("/proc/self/maps"):
    fields = line.split()
    lo, hi = (int(v, 16) for v in fields[0].split("-"))
    if len(fields) < 6 and "r" in fields[1] and abs(lo - entry) < (64 << 20):
        words = array.array("Q", bytes((ctypes.c_char * (hi - lo)).from_address(lo)))
        found.update(addresses[w] for w in set(words) & addresses.keys())
"""

# Binds the JIT to the library over the stand-in runtime (argv[1]) where argv[2] says "first",
# after one kernel was compiled where it says "late", not at all where "none"; then compiles one
# kernel and says which library its host code's runtime entries are bound to.
WHICH_LIBRARY = (
    """
import array, ctypes, importlib, os, sys
from pathlib import Path
from llmcompile.runtime import cudart
from llmcompile.specs import contract, get_op
spec = get_op("log_softmax")
mod = importlib.import_module(f"reference_kernels.{spec.reference_module}")
compile = lambda n: contract.compile_entry(contract.entry_of(mod), spec, "float32", n)
if sys.argv[2] == "late":
    compile(512)
bridge = cudart.use_torch_cudart(Path(sys.argv[1])) if sys.argv[2] != "none" else None
fn = compile(256)
libs = (cudart.build_bridge(Path(sys.argv[1])), cudart.static_runtime().with_name(cudart.JIT_RUNTIME))
"""
    + SCAN
    + """
print(bridge is not None, sorted({lib for lib, _ in found}), len(found))
"""
)


def stand_in_cudart(tmp: Path) -> Path:
    """A libcudart with every CUDA runtime function CuTe DSL's archive calls, each returning 0."""
    out = subprocess.run(["nm", "-u", str(cudart.static_runtime())], capture_output=True, text=True, check=True)
    names = sorted({line.split()[-1] for line in out.stdout.splitlines() if re.search(r"\bcuda[A-Z]\w*$", line)})
    src = tmp / "cudart.c"
    src.write_text("".join(f"int {n}(void) {{ return 0; }}\n" for n in names))
    lib = tmp / "libcudart.so.12"
    subprocess.run(["cc", "-shared", "-fPIC", "-Wl,-soname,libcudart.so.12", "-o", str(lib), str(src)], check=True)
    return lib


@pytest.fixture(scope="module")
def bridge(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("cudart")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LLMCOMPILE_CACHE", str(tmp / "cache"))
        return cudart.build_bridge(stand_in_cudart(tmp))


@needs_cc
def test_the_library_has_every_entry_of_the_archive_over_the_given_runtime(bridge: Path) -> None:
    archive = subprocess.run(["nm", "--defined-only", str(cudart.static_runtime())], capture_output=True, text=True)
    entries = {f.split()[-1] for f in archive.stdout.splitlines() if re.search(r" T (_cu|cuda_dialect_)", f)}
    exported = set(library.exported_symbols(bridge))
    assert len(entries) > 50 and entries <= exported
    assert "CuteDSLRT_TVMFFISetRaisedCudaError" in exported  # the shim's
    undefined = library.undefined_symbols(bridge)
    assert "cudaLaunchKernelExC" in undefined and not [s for s in undefined if library.CUTE_RUNTIME_SYMBOL.match(s)]
    needed = subprocess.run(["objdump", "-p", str(bridge)], capture_output=True, text=True).stdout
    assert re.search(r"NEEDED\s+libcudart\.so\.12", needed)


def test_the_switch_and_a_callers_libs_keep_cute_dsls_runtime(monkeypatch: pytest.MonkeyPatch) -> None:
    for env, value in (("LLMCOMPILE_TORCH_CUDART", "0"), ("CUTE_DSL_LIBS", "/their/own.so")):
        monkeypatch.setattr(cudart, "_state", {})
        with monkeypatch.context() as mp:
            mp.setenv(env, value)
            assert cudart.use_torch_cudart(Path("/no/such/libcudart.so.12")) is None


@needs_cc
@pytest.mark.parametrize("cached", [False, True], ids=["compiled", "from-file-cache"])
def test_the_jit_binds_kernels_to_the_library_loaded_before_its_own(bridge: Path, tmp_path: Path, cached: bool) -> None:
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "CUTE_DSL_ARCH": "sm_90a"}
    env |= {"CUTE_DSL_CACHE_DIR": str(tmp_path / "cute"), "LLMCOMPILE_CACHE": str(bridge.parent)}
    runtime = str(bridge.parent.parent / "libcudart.so.12")

    def bound(when: str) -> str:
        cmd = [sys.executable, "-c", WHICH_LIBRARY, runtime, when]
        done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env, timeout=600)
        assert done.returncode == 0, done.stderr[-2000:]
        return done.stdout.strip().splitlines()[-1]

    if cached:
        assert bound("none") == f"False ['{cudart.JIT_RUNTIME}'] 3"  # compiled into CuTe DSL's file cache
    assert bound("first") == f"True ['{bridge.name}'] 3"
    # too late once CuTe DSL's runtime is loaded: said (None), and the scan sees that runtime bound
    assert bound("late") == f"False ['{cudart.JIT_RUNTIME}'] 3"


# The reference kernels in a fresh process, as a user calls them: the JIT bound to the library
# over torch's runtime, and the kernel right.
GPU_CALL = (
    """
import array, ctypes, torch
from llmcompile import kernels
from llmcompile.runtime import cudart
x = torch.randn(4096, 256, device="cuda")
err = (kernels.log_softmax(x).double() - torch.log_softmax(x.double(), -1)).abs().max().item()
bridge = cudart.use_torch_cudart()
fn = kernels.log_softmax.compiled("float32", 256)
libs = [lib for lib in (bridge, cudart.static_runtime().with_name(cudart.JIT_RUNTIME)) if lib is not None]
"""
    + SCAN
    + """
print(bridge is not None, sorted({lib for lib, _ in found}), len(found), err < 1e-5)
"""
)


@pytest.mark.gpu
@pytest.mark.parametrize("switch", ["1", "0"])
def test_reference_kernels_launch_through_torchs_runtime(switch: str) -> None:
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    env = {**os.environ, "LLMCOMPILE_TORCH_CUDART": switch}
    done = subprocess.run(
        [sys.executable, "-c", GPU_CALL], capture_output=True, text=True, cwd=ROOT, env=env, timeout=600
    )
    assert done.returncode == 0, done.stderr[-2000:]
    lib = re.search(r"'(cute-runtime-\w+\.so)'", done.stdout)
    got = done.stdout.strip().splitlines()[-1]
    assert got == (
        f"True ['{lib and lib.group(1)}'] 3 True" if switch == "1" else f"False ['{cudart.JIT_RUNTIME}'] 3 True"
    )
