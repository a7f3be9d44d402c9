"""Probes for the judge's design: read-only VMM inputs, and the clock drop after float64 work."""

import json
import subprocess
import sys
import time

import torch


def vmm_probe(out):
    from cuda.bindings import driver as cu

    torch.cuda.init()
    torch.empty(1, device="cuda")
    dev = torch.cuda.current_device()
    prop = cu.CUmemAllocationProp()
    prop.type = cu.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
    prop.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    prop.location.id = dev
    err, gran = cu.cuMemGetAllocationGranularity(prop, cu.CUmemAllocationGranularity_flags.CU_MEM_ALLOC_GRANULARITY_MINIMUM)
    out["granularity"] = int(gran)

    def alloc(nbytes):
        size = -(-nbytes // gran) * gran
        t0 = time.perf_counter()
        err, handle = cu.cuMemCreate(size, prop, 0)
        assert err == cu.CUresult.CUDA_SUCCESS, err
        err, ptr = cu.cuMemAddressReserve(size, 0, 0, 0)
        assert err == cu.CUresult.CUDA_SUCCESS, err
        (err,) = cu.cuMemMap(ptr, size, 0, handle, 0)
        assert err == cu.CUresult.CUDA_SUCCESS, err
        t1 = time.perf_counter()
        return handle, ptr, size, t1 - t0

    def access(ptr, size, flags):
        desc = cu.CUmemAccessDesc()
        desc.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        desc.location.id = dev
        desc.flags = flags
        t0 = time.perf_counter()
        (err,) = cu.cuMemSetAccess(ptr, size, [desc], 1)
        return err, time.perf_counter() - t0

    class Arr:
        def __init__(self, ptr, nbytes):
            self.__cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1", "data": (int(ptr), False), "version": 3}

    RW = cu.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
    RO = cu.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READ
    import atexit
    for mb in (16, 256):
        handle, ptr, size, t_alloc = alloc(mb << 20)
        e1, t_rw = access(ptr, size, RW)
        t = torch.as_tensor(Arr(ptr, size), device="cuda").view(torch.float32)
        t.fill_(1.0)
        torch.cuda.synchronize()
        e2, t_ro = access(ptr, size, RO)
        s = float(t.sum())
        torch.cuda.synchronize()
        e3, t_rw2 = access(ptr, size, RW)
        t.fill_(2.0)
        torch.cuda.synchronize()
        e4, _ = access(ptr, size, RO)
        s2 = float(t.sum())
        out[f"vmm_{mb}MB"] = {
            "alloc_s": t_alloc, "rw_s": t_rw, "ro_s": t_ro, "rw_again_s": t_rw2,
            "errs": [str(e) for e in (e1, e2, e3, e4)], "sum_ro": s, "sum_ro2": s2,
        }
    # a write into read-only memory, in a child process: what the error says
    child = r'''
import torch
from cuda.bindings import driver as cu
import sys
sys.path.insert(0, ".scratch")
from probe import ro_tensor
t = ro_tensor(1 << 20)
print("read ok", float(t.sum()), flush=True)
t.fill_(3.0)
try:
    torch.cuda.synchronize()
    print("no fault; value", float(t[0]))
except Exception as e:
    print("FAULT", type(e).__name__, str(e)[:300])
'''
    r = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=120)
    out["ro_write_child"] = {"rc": r.returncode, "stdout": r.stdout[-800:], "stderr": r.stderr[-800:]}


def ro_tensor(nbytes):
    from cuda.bindings import driver as cu

    torch.empty(1, device="cuda")
    dev = torch.cuda.current_device()
    prop = cu.CUmemAllocationProp()
    prop.type = cu.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
    prop.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    prop.location.id = dev
    _, gran = cu.cuMemGetAllocationGranularity(prop, cu.CUmemAllocationGranularity_flags.CU_MEM_ALLOC_GRANULARITY_MINIMUM)
    size = -(-nbytes // gran) * gran
    _, handle = cu.cuMemCreate(size, prop, 0)
    _, ptr = cu.cuMemAddressReserve(size, 0, 0, 0)
    cu.cuMemMap(ptr, size, 0, handle, 0)
    desc = cu.CUmemAccessDesc()
    desc.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    desc.location.id = dev
    desc.flags = cu.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
    cu.cuMemSetAccess(ptr, size, [desc], 1)

    class Arr:
        __cuda_array_interface__ = {"shape": (size,), "typestr": "|u1", "data": (int(ptr), False), "version": 3}

    t = torch.as_tensor(Arr(), device="cuda").view(torch.float32)
    t.fill_(1.0)
    torch.cuda.synchronize()
    desc.flags = cu.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READ
    print("set RO:", cu.cuMemSetAccess(ptr, size, [desc], 1))
    ro_tensor.keep = (handle, ptr)
    return t


def copy_tbs(src, dst, reps=30):
    for _ in range(3):
        dst.copy_(src)
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(reps):
        dst.copy_(src)
    e.record()
    e.synchronize()
    return 2 * src.nbytes * reps / (s.elapsed_time(e) * 1e-3) / 1e12


def clock_probe(out):
    src = torch.randn(1 << 28, device="cuda").to(torch.bfloat16)
    dst = torch.empty_like(src)
    res = {"idle": copy_tbs(src, dst)}

    def f64(elems):
        x = torch.randn(elems, device="cuda", dtype=torch.float64)
        for _ in range(3):
            y = torch.softmax(x.view(-1, 4096), -1)
            (y - x.view(-1, 4096)).abs().max().item()
        del x, y

    for label, elems in (("verify-size 4M", 1 << 22), ("timed-size 2^28", 1 << 28)):
        for wait in (0.0, 0.5, 1.0, 2.0, 5.0):
            f64(elems)
            torch.cuda.synchronize()
            time.sleep(wait)
            res[f"after {label} +{wait}s"] = copy_tbs(src, dst)
    out["clock"] = res


if __name__ == "__main__":
    out = {"torch": torch.__version__, "gpu": torch.cuda.get_device_name()}
    if sys.argv[2:] == ["vmm"]:
        try:
            vmm_probe(out)
        except Exception as e:  # noqa: BLE001
            out["vmm_error"] = f"{type(e).__name__}: {e}"
    else:
        clock_probe(out)
    print(json.dumps(out, indent=1))
    json.dump(out, open(sys.argv[1], "w"), indent=1)
