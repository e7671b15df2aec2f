"""docker/smoke_test.py on CPU: every level runs, GPU-only checks are skipped, not failed.

The script is loaded from its file (it is copied alone into the image, not imported as part of
a package); the full level also runs as a subprocess, exactly as the build runs it.
"""

from __future__ import annotations

import ctypes.util
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "docker" / "smoke_test.py"
GPU_ONLY = {"gpus", "efa_devices"}
IMAGE_ONLY = {"no_infra_packages", "efa_libraries"}
QUICK = {"imports", "trainer_flags", "torchao_pairing", "no_infra_packages", "cache_dirs_writable"}


@pytest.fixture(scope="module")
def smoke() -> ModuleType:
    spec = importlib.util.spec_from_file_location("smoke_test", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["smoke_test"] = module  # dataclasses resolve their module by name
    spec.loader.exec_module(module)
    return module


def by_name(results: list[object]) -> dict[str, object]:
    return {r.name: r for r in results}  # type: ignore[attr-defined]


@pytest.mark.slow
def test_full_level_passes_on_cpu_as_the_build_runs_it(tmp_path: Path) -> None:
    out = tmp_path / "results.json"
    env = {**os.environ, "TRITON_CACHE_DIR": str(tmp_path / "triton")}
    env.pop("TORCHINDUCTOR_CACHE_DIR", None)
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--level", "full", "--json", str(out)],
        capture_output=True,
        text=True,
        cwd=tmp_path,  # the trainer is found as an installed package, not via the cwd
        env=env,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    results = {r["name"]: r for r in json.loads(out.read_text())}
    assert {r["level"] for r in results.values()} == {"quick", "standard", "full"}
    assert [n for n, r in results.items() if r["status"] == "failed"] == []
    for name in GPU_ONLY | IMAGE_ONLY | {"torch_cuda_build"}:
        assert results[name]["status"] == "skipped"
        assert results[name]["detail"].startswith("not applicable: ")
    passed = ("imports", "trainer_flags", "torchao_pairing", "cache_dirs_writable", "model_configs")
    for name in (*passed, "tiny_training_steps", "collective"):
        assert results[name]["status"] == "passed", results[name]
    assert "loss" in results["tiny_training_steps"]["detail"]
    assert "gloo" in results["collective"]["detail"]
    assert (tmp_path / "triton").is_dir()
    assert "level full: 7 passed, 5 skipped (not applicable), 0 failed" in result.stderr


@pytest.mark.parametrize(
    ("level", "expected"),
    [
        ("quick", QUICK),
        (
            "standard",
            QUICK
            | {
                "torch_cuda_build",
                "gpus",
                "efa_libraries",
                "efa_devices",
                "model_configs",
            },
        ),
    ],
)
def test_lower_levels_run_their_checks_only(
    smoke: ModuleType,
    level: str,
    expected: set[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton"))
    ctx = smoke.Context(image=False, library_dirs=())
    results = smoke.run_checks(level, ctx)
    assert {r.name for r in results} == expected
    assert [r.name for r in results if r.status == "failed"] == []
    assert {r.name for r in results if r.status == "skipped"} == (
        expected & (GPU_ONLY | IMAGE_ONLY | {"torch_cuda_build"})
    )


def test_unwritable_cache_dir_fails_and_image_mode_requires_one(
    smoke: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("TRITON_CACHE_DIR", str(blocker / "triton"))
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    ctx = smoke.Context(image=False, library_dirs=())
    with pytest.raises(AssertionError, match=r"TRITON_CACHE_DIR=.* is not writable"):
        smoke.check_cache_dirs_writable(ctx)
    monkeypatch.delenv("TRITON_CACHE_DIR")
    with pytest.raises(AssertionError, match="TRITON_CACHE_DIR is not set"):
        smoke.check_cache_dirs_writable(smoke.Context(image=True, library_dirs=()))


def test_a_base_torch_the_pinned_torchao_does_not_run_with_fails_the_build(
    smoke: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch

    ctx = smoke.Context(image=True, library_dirs=())
    assert "torchao 0.18.0" in smoke.check_torchao_pairing(ctx)
    monkeypatch.setattr(torch, "__version__", "2.10.0a0+b4e4ee81d3")  # NGC 25.12's torch
    result = by_name(smoke.run_checks("quick", ctx))["torchao_pairing"]
    assert result.status == "failed"  # type: ignore[attr-defined]
    assert "this is torch 2.10.0a0+b4e4ee81d3" in result.detail  # type: ignore[attr-defined]


def test_an_unknown_level_is_named(smoke: ModuleType) -> None:
    with pytest.raises(ValueError, match="'thorough'"):
        smoke.run_checks("thorough", smoke.Context(image=False, library_dirs=()))


def test_image_mode_fails_where_the_image_would_be_wrong(smoke: ModuleType, tmp_path: Path) -> None:
    """In image mode this CPU dev environment is a broken image: pulumi present, CPU torch,
    no EFA libraries. Each of those must be a failure that names the problem."""
    results = by_name(
        smoke.run_checks("standard", smoke.Context(image=True, library_dirs=(str(tmp_path),)))
    )
    assert results["no_infra_packages"].status == "failed"  # type: ignore[attr-defined]
    assert "pulumi" in results["no_infra_packages"].detail  # type: ignore[attr-defined]
    assert results["torch_cuda_build"].status == "failed"  # type: ignore[attr-defined]
    assert "CPU-only" in results["torch_cuda_build"].detail  # type: ignore[attr-defined]
    assert results["efa_libraries"].status == "failed"  # type: ignore[attr-defined]
    assert "libfabric not found" in results["efa_libraries"].detail  # type: ignore[attr-defined]
    assert smoke.main(["--level", "quick", "--image"]) == 1


def test_efa_libraries_are_found_and_loaded(smoke: ModuleType, tmp_path: Path) -> None:
    """Stand-ins under the real names: any loadable shared library proves the load path."""
    real = ctypes.util.find_library("z") or ctypes.util.find_library("c")
    assert real is not None
    source = next(
        p
        for d in ("/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib64", "/usr/lib64")
        if (p := Path(d) / real).exists()
    )
    for name in ("libfabric.so.1", "libnccl-net-ofi.so"):
        shutil.copy(source, tmp_path / name)
    ctx = smoke.Context(image=True, library_dirs=(str(tmp_path / "missing"), str(tmp_path)))
    detail = smoke.check_efa_libraries(ctx)
    assert f"libfabric {tmp_path}/libfabric.so.1" in detail
    assert f"aws-ofi-nccl {tmp_path}/libnccl-net-ofi.so" in detail


def test_a_library_that_does_not_load_fails(smoke: ModuleType, tmp_path: Path) -> None:
    (tmp_path / "libfabric.so.1").write_bytes(b"not an ELF file")
    ctx = smoke.Context(image=True, library_dirs=(str(tmp_path),))
    with pytest.raises(OSError):
        smoke.check_efa_libraries(ctx)


def test_loader_dirs_include_ld_library_path(
    smoke: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LD_LIBRARY_PATH", "/opt/x/lib::/opt/y/lib")
    dirs = smoke.default_library_dirs()
    assert dirs[:2] == ("/opt/x/lib", "/opt/y/lib")
    assert "/opt/amazon/efa/lib" in dirs
    assert len(dirs) == len(set(dirs))
