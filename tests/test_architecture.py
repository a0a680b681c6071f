"""Data flows one way: the model and solver packages know nothing of HTTP."""

from __future__ import annotations

import ast
import inspect
import subprocess
import sys
from pathlib import Path

import pytest

import perfmodel.errors
import solver.errors
from app.errors import HANDLERS
from device_profiles import ModelNotServed, ProfileError, UnknownDevice


@pytest.mark.parametrize(
    ("module", "forbidden"),
    [
        ("solver", ("fastapi", "starlette", "app", "pydantic")),
        # explore shortlists and beliefs run in every optimize job: no fitting engine (scipy)
        ("solver.explore", ("fastapi", "starlette", "app", "pydantic", "scipy")),
        ("perfmodel.belief", ("fastapi", "starlette", "app", "pydantic", "scipy")),
        ("perfmodel.gemm_ws", ("fastapi", "starlette", "app", "pydantic")),
        ("perfmodel.ptx", ("fastapi", "starlette", "app", "pydantic")),
        # reads validated device profiles (device_profiles uses pydantic for its file schema)
        ("perfmodel.manybsp", ("fastapi", "starlette", "app")),
        # Many-BSP measurements carry predict requests, so calibration reads profiles too
        ("perfmodel.calibration", ("fastapi", "starlette", "app")),
        ("solver.calibration_loop", ("fastapi", "starlette", "app")),
        # pictures take core dataclasses or plain dicts; matplotlib loads on the first picture
        ("render", ("fastapi", "starlette", "app", "matplotlib", "numpy")),
    ],
)
def test_core_packages_do_not_import_the_http_layer(
    module: str, forbidden: tuple[str, ...]
) -> None:
    code = f"import sys, {module};print(','.join(m for m in {forbidden!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def _domain_errors() -> list[type[BaseException]]:
    classes: list[type[BaseException]] = [UnknownDevice, ModelNotServed]
    for module in (solver.errors, perfmodel.errors):
        for _, obj in inspect.getmembers(module, inspect.isclass):
            if issubclass(obj, Exception) and obj.__module__ == module.__name__:
                classes.append(obj)
    return classes


def test_every_domain_error_has_an_http_mapping() -> None:
    unmapped = [
        cls.__name__
        for cls in _domain_errors()
        if not any(issubclass(cls, handled) for handled in HANDLERS)
    ]
    assert unmapped == []


def test_profile_errors_are_startup_errors_not_request_errors() -> None:
    # A broken profile file must stop the service at start-up, so it is not mapped to HTTP.
    assert ProfileError not in HANDLERS


def _imported_modules(path: Path) -> set[str]:
    """Every module an ``import``/``from`` statement names, at any depth (lazy imports too)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module is not None:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


APP_DIR = Path(__file__).resolve().parents[1] / "app"


@pytest.mark.parametrize(
    ("package", "forbidden"),
    [
        # routes -> jobs -> core: no module outside app/routes (and main, which mounts them)
        # reaches back into a route, lazily or not
        (".", ("app.routes",)),
        # conversions sit beside the schemas: they know neither routes nor jobs
        ("convert", ("app.routes", "app.jobs", "app.service")),
        # the store knows bytes, not HTTP, schemas or the service that holds it
        (
            "store",
            ("fastapi", "starlette", "pydantic", "app.service", "app.cache", "app.settings"),
        ),
    ],
)
def test_app_layers_import_one_way(package: str, forbidden: tuple[str, ...]) -> None:
    offenders = []
    for path in sorted((APP_DIR / package).rglob("*.py")):
        relative = path.relative_to(APP_DIR).as_posix()
        if relative.startswith("routes/") or relative == "main.py":
            continue
        bad = sorted(m for m in _imported_modules(path) if m.startswith(forbidden))
        if bad:
            offenders.append(f"{relative}: {', '.join(bad)}")
    assert offenders == []


def test_the_service_process_loads_no_numerical_stack() -> None:
    """Calibration (numpy, scipy) and pictures (matplotlib) run in the workers: the service's
    own process, which imports app.main, never loads them (import time, resident memory)."""
    heavy = ("numpy", "scipy", "matplotlib", "perfmodel.calibration")
    code = f"import sys, app.main;print(','.join(m for m in {heavy!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_device_profiles_modules_import_no_circle() -> None:
    """Issue 16: schema.py (the file format) and status.py (what a profile lacks) each do one
    job; the schema imports nothing of the package (no circle, lazy or not)."""
    source = (Path(__file__).resolve().parents[1] / "device_profiles" / "schema.py").read_text()
    imported = {
        node.module
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.ImportFrom) and node.module
    }
    assert not {m for m in imported if m.startswith("device_profiles")}
