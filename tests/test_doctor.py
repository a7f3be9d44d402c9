"""The doctor's bytecode check: packages every process would compile from source again."""

from __future__ import annotations

import compileall
from pathlib import Path

import pytest

from llmcompile import doctor


def _package(root: Path, name: str, modules: int) -> Path:
    pkg = root / name
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    for i in range(modules - 1):
        (pkg / "sub" / f"m{i}.py").write_text(f"X = {i}\n")
    return pkg


def test_a_package_without_bytecode_is_named_until_it_is_compiled(tmp_path: Path, monkeypatch) -> None:
    pkg = _package(tmp_path, "llmc_fake_pkg", 5)
    monkeypatch.syspath_prepend(str(tmp_path))
    gaps = doctor.uncompiled(("llmc_fake_pkg", "llmc_no_such_pkg"))
    assert [(g.package, g.root, g.missing, g.modules) for g in gaps] == [("llmc_fake_pkg", str(pkg), 5, 5)]
    advice = doctor.bytecode_advice(gaps)
    assert "llmc_fake_pkg (5 of 5 modules)" in advice and advice.endswith(f"-m compileall -q {tmp_path}")
    assert compileall.compile_dir(str(pkg), quiet=1)
    assert doctor.uncompiled(("llmc_fake_pkg",)) == []


def test_a_package_mostly_compiled_is_not_named(tmp_path: Path, monkeypatch) -> None:
    pkg = _package(tmp_path, "llmc_fake_pkg2", 4)
    compileall.compile_dir(str(pkg), quiet=1)
    (pkg / "sub" / "late.py").write_text("Y = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert doctor.uncompiled(("llmc_fake_pkg2",)) == []


def test_the_report_says_whether_bytecode_is_cached(monkeypatch: pytest.MonkeyPatch) -> None:
    gap = doctor.Uncompiled("torch", "/x/torch", 2141, 2141)
    monkeypatch.setattr(doctor, "uncompiled", lambda: [gap])
    _, text = doctor.report()
    assert "bytecode       missing" in text and "torch (2141 of 2141 modules)" in text
    monkeypatch.setattr(doctor, "uncompiled", lambda: [])
    assert "bytecode       cached" in doctor.report()[1]
