"""GPU targets as data: what the kernels are compiled for and what the numbers are held to."""

from __future__ import annotations

from dataclasses import asdict, dataclass


class TargetError(RuntimeError):
    """The requested target does not match the machine (or there is no GPU at all)."""


@dataclass(frozen=True)
class Target:
    name: str
    arch: str  # CuTe DSL / ptxas architecture, e.g. "sm_90a"
    compute_capability: tuple[int, int]
    sms: int
    smem_per_sm_kb: int
    max_cluster: int
    nominal_bandwidth_tbs: float  # datasheet HBM bandwidth; the measured copy is the real SOL
    l2_mb: int
    device_names: tuple[str, ...]  # substrings of torch.cuda.get_device_name that match it

    def as_dict(self) -> dict[str, object]:
        return asdict(self)

    def is_gpu(self, gpu: str) -> bool:
        """Whether the device named `gpu` (torch.cuda.get_device_name) is this target."""
        return any(s.lower() in gpu.lower() for s in self.device_names)


# what a command, the judge and a suite use where no target is given
DEFAULT_TARGET = "h100"
TARGETS: dict[str, Target] = {
    "h100": Target("h100", "sm_90a", (9, 0), 132, 228, 16, 3.35, 50, ("H100",)),
    "h200": Target("h200", "sm_90a", (9, 0), 132, 228, 16, 4.8, 60, ("H200",)),
}


def get_target(name: str) -> Target:
    try:
        return TARGETS[name.lower()]
    except KeyError:
        raise TargetError(f"unknown target {name!r}; known targets: {', '.join(sorted(TARGETS))}") from None


def current_gpu() -> str | None:
    """Name of the visible CUDA device, or None when there is none (no driver, CPU torch)."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    return torch.cuda.get_device_name(0)


def target_for(gpu: str) -> Target | None:
    """The known target that the device named `gpu` is, or None (one we hold no numbers for)."""
    return next((t for t in TARGETS.values() if t.is_gpu(gpu)), None)


def target_here() -> Target | None:
    """The known target that the visible GPU is, or None (no GPU, or one we hold no numbers for)."""
    gpu = current_gpu()
    return None if gpu is None else target_for(gpu)


def require_gpu(target: Target) -> str:
    """Return the GPU's name if it is `target`; raise TargetError with plain advice otherwise."""
    gpu = current_gpu()
    if gpu is None:
        raise TargetError(
            f"no CUDA GPU is visible: running and timing kernels for {target.name} needs one "
            "(compiling does not: kernels build for sm_90a on any machine)"
        )
    if not target.is_gpu(gpu):
        raise TargetError(f"target {target.name} asked for, but this GPU is {gpu!r}; pass --target for it")
    return gpu
