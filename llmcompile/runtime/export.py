"""`llmcompile export OP|RUN_DIR --out DIR`: a kernel as a self-contained artifact.

DIR gets `manifest.json`, the sealed object file of each N and `kernels.so`, their link
(`llmcompile.runtime.library`): `llmcompile.loader.load(DIR)` calls it from torch with neither CuTe DSL
nor a compile, and C++ opens it through TVM-FFI. For a built-in OP the reference kernel is
compiled here for each --n, and its host modules go through the same audit and sealing as a
candidate's (`seal.seal`); for a RUN_DIR, its `best/artifact` (what the judge verified and
timed) is copied and linked.
"""

from __future__ import annotations

import importlib
import shutil
from pathlib import Path

from llmcompile.runtime import artifact, library, seal
from llmcompile.runtime.artifact import ArtifactError, ArtifactManifest
from llmcompile.runtime.callspec import CallSpec
from llmcompile.specs import OpError, contract, dtype_name, get_op


def _run_artifact(path: Path) -> Path | None:
    """The artifact a run directory, its best/ or an artifact directory holds."""
    for d in (path / "best" / "artifact", path / "artifact", path):
        if (d / "manifest.json").is_file():
            return d
    return None


def export_op(op: str, dtype: str, ns: list[int], out: Path) -> ArtifactManifest:
    """The built-in `op`'s reference kernel, compiled for `dtype` at each N, sealed and linked."""
    from llmcompile.runtime.launches import check_launchable, launches_of

    spec, dtype = get_op(op), dtype_name(dtype)
    if spec.reference_module is None:
        raise OpError(f"{op} has no reference kernel to export; export a run directory instead")
    if not ns:
        raise OpError("export of an op needs the row lengths to compile for: --n N [N ...]")
    spec.check_problem(1, max(ns), dtype)
    mod = importlib.import_module(f"reference_kernels.{spec.reference_module}")
    entry, workspace = contract.entry_of(mod), contract.workspace_of(mod)
    objects: dict[str, bytes] = {}
    launches: dict[str, dict[str, list[int]]] = {}
    for n in ns:
        fn = contract.compile_entry(entry, spec, dtype, n, workspace=workspace)
        check_launchable(launches_of(fn))
        objects[str(n)], launches[str(n)] = seal.seal(str(fn.ir_module), n)
    man, files = artifact.manifest_for(
        spec.name,
        dtype,
        objects,
        launches,
        [t.name for t in spec.tensors],
        list(spec.scalars),
        Path(mod.__file__).read_text(),
        workspace,
        CallSpec.of(spec).to_json(),
    )
    _fresh(out)
    artifact.write(out, man, files)
    return library.link(out)


def export_run(run: Path, out: Path) -> ArtifactManifest:
    """A run's best kernel (or any artifact directory), copied to `out` and linked."""
    src = _run_artifact(run)
    if src is None:
        raise OpError(f"{run} holds no kernel artifact (a run directory with best/artifact/, or an artifact)")
    man = artifact.read(src)
    for name in man.objects.values():  # before anything is written
        artifact.checked_bytes(src, man, name)
    if not man.call:  # an artifact from before manifests carried the call: the op must be known here
        try:
            man.call = CallSpec.of(get_op(man.op)).to_json()
        except OpError as e:
            raise ArtifactError(
                f"{src}'s manifest does not say how to call it, and its op is unknown here: {e}"
            ) from None
    _fresh(out)
    for name in man.objects.values():
        shutil.copy2(src / name, out / name)
    artifact.write(out, man, {})
    return library.link(out)


def _fresh(out: Path) -> None:
    if out.exists() and any(out.iterdir()) and not (out / "manifest.json").is_file():
        raise OpError(f"{out} exists and is not an artifact directory: choose an empty or new --out")
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
