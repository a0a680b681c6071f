"""Data flows one way: the model and solver packages know nothing of HTTP."""

from __future__ import annotations

import ast
import importlib.metadata
import inspect
import re
import subprocess
import sys
import tomllib
from collections.abc import Collection, Mapping
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
    """schema.py (the file format) and status.py (what a profile lacks) each do one
    job; the schema imports nothing of the package (no circle, lazy or not)."""
    source = (Path(__file__).resolve().parents[1] / "device_profiles" / "schema.py").read_text()
    imported = {
        node.module
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.ImportFrom) and node.module
    }
    assert not {m for m in imported if m.startswith("device_profiles")}


# ---------------------------------------------------------------------------- user side

KPERF_CLIENT_DIR = Path(__file__).resolve().parents[1] / "kperf_client"
#: the server's packages and the dependencies only the server installs (kperf[server])
SERVER_MODULES = (
    "app",
    "solver",
    "perfmodel",
    "device_profiles",
    "render",
    "fastapi",
    "fastapi_offline",
    "starlette",
    "uvicorn",
    "pydantic_settings",
    "prometheus_client",
    "redis",
    "z3",
    "numpy",
    "scipy",
    "matplotlib",
)
#: the only places the user side may reach the server, lazily: `kperf serve` runs it, and the
#: in-process client (no --url) builds it (kperf_client/client.py, module docstring)
LAZY_SERVER_IMPORTS = {
    ("cli.py", "_serve"),
    ("client.py", "KperfClient.__aenter__"),
    # the Kernel Tuner strategy's surrogate: imported only inside a tuning
    # (kernel_tuner.py, lazily), where Kernel Tuner and its numpy are installed
    ("kernel_tuner_surrogate.py", ""),
}


def _is_server_module(name: str) -> bool:
    return any(name == m or name.startswith(f"{m}.") for m in SERVER_MODULES)


def _server_imports(tree: ast.AST, scope: str = "") -> list[tuple[str, str]]:
    """(enclosing function, module) of every server import, skipping ``if TYPE_CHECKING:``
    blocks (annotations only, never run)."""
    found: list[tuple[str, str]] = []
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and ast.unparse(node.test) in (
            "TYPE_CHECKING",
            "typing.TYPE_CHECKING",
        ):
            found += [f for child in node.orelse for f in _server_imports(child, scope)]
            continue
        if isinstance(node, ast.Import):
            found += [(scope, a.name) for a in node.names if _is_server_module(a.name)]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if _is_server_module(node.module):
                found.append((scope, node.module))
        inner = scope
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            inner = f"{scope}.{node.name}" if scope else node.name
        found += _server_imports(node, inner)
    return found


def test_the_user_side_imports_nothing_of_the_server() -> None:
    """kperf_client installs and runs without the server, except where documented."""
    offenders = []
    for path in sorted(KPERF_CLIENT_DIR.rglob("*.py")):
        relative = path.relative_to(KPERF_CLIENT_DIR).as_posix()
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for scope, module in _server_imports(tree):
            if (relative, scope) not in LAZY_SERVER_IMPORTS:
                offenders.append(f"{relative}:{scope or '<module>'}: {module}")
    assert offenders == []


def test_the_static_check_sees_lazy_and_type_checking_imports() -> None:
    source = (
        "import numpy\n"
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from app.settings import Settings\n"
        "class C:\n    async def m(self):\n        from app.main import create_app\n"
        "def f():\n    import z3\n"
    )
    assert _server_imports(ast.parse(source)) == [
        ("", "numpy"),
        ("C.m", "app.main"),
        ("f", "z3"),
    ]


def test_the_user_side_loads_no_server_module() -> None:
    """Importing the client, the CLI and the sweep, and running ``kperf --help`` (and a
    command's help), loads none of the server's packages nor its heavy dependencies."""
    code = (
        "import sys\n"
        "import kperf_client.client, kperf_client.cli, kperf_client.sweep\n"
        "import kperf_client.sweep.console\n"
        "for argv in (['--help'], ['devices', '--help'], ['sweep', '--help']):\n"
        "    try:\n"
        "        kperf_client.cli.main(argv)\n"
        "    except SystemExit:\n"
        "        pass\n"
        f"loaded = sorted(m for m in sys.modules if m.split('.')[0] in {SERVER_MODULES!r})\n"
        "print('LOADED', ','.join(loaded))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "usage: kperf" in out.stdout
    assert out.stdout.strip().splitlines()[-1] == "LOADED"


def _third_party_imports(tree: ast.AST) -> set[str]:
    """Top-level names of every non-standard-library module a file imports."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return {n for n in names if n not in sys.stdlib_module_names and n != "kperf_client"}


def _distributions(requirements: list[str]) -> set[str]:
    return {
        re.split(r"[<>=!~;\[ ]", r, maxsplit=1)[0].lower().replace("_", "-") for r in requirements
    }


def test_the_user_side_needs_only_the_base_dependencies() -> None:
    """``pip install kperf`` (no extra) has every distribution kperf_client imports,
    but for a plug-in module's own tool, which its extra installs (kperf_client/triton.py:
    ``kperf[triton]``, kernel_tuner.py: ``kperf[kernel-tuner]``); the server's dependencies
    are in the ``server`` extra."""
    project = tomllib.loads((KPERF_CLIENT_DIR.parent / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    base = _distributions(project["dependencies"])
    server = _distributions(extras["server"])
    providers = importlib.metadata.packages_distributions()
    missing = []
    for path in sorted(KPERF_CLIENT_DIR.rglob("*.py")):
        plugin_extra = extras.get(path.stem.replace("_", "-"), [])
        allowed = base | _distributions(plugin_extra) if path.parent == KPERF_CLIENT_DIR else base
        for module in _third_party_imports(ast.parse(path.read_text(encoding="utf-8"))):
            if _is_server_module(module):
                continue  # the server's: only in the lazy spots, checked above
            for dist in providers.get(module, [module]):
                if dist.lower().replace("_", "-") not in allowed:
                    missing.append(f"{path.relative_to(KPERF_CLIENT_DIR)}: {module} ({dist})")
    assert missing == []
    assert base.isdisjoint(server) and {"fastapi", "z3-solver", "numpy"} <= server


# ---------------------------------------------------------------------------- import graph

REPO = Path(__file__).resolve().parents[1]
PRODUCT_PACKAGES = ("app", "solver", "perfmodel", "render", "device_profiles", "kperf_client")


def _product_modules() -> dict[str, Path]:
    modules = {}
    for package in PRODUCT_PACKAGES:
        for path in (REPO / package).rglob("*.py"):
            parts = list(path.relative_to(REPO).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            modules[".".join(parts)] = path
    return modules


def _imports(source: str, modules: Collection[str]) -> set[str]:
    """The product modules ``source`` imports, when it is imported or when one of its functions
    runs (lazy imports too), but under ``if TYPE_CHECKING:`` (``from package import submodule``
    imports the submodule)."""
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and ast.unparse(child.test) in (
                "TYPE_CHECKING",
                "typing.TYPE_CHECKING",
            ):
                for other in child.orelse:
                    visit(other)
                continue
            if isinstance(child, ast.Import):
                found.update(a.name for a in child.names)
            elif isinstance(child, ast.ImportFrom) and child.module and child.level == 0:
                submodules = {f"{child.module}.{a.name}" for a in child.names}
                found.update(submodules & set(modules) or {child.module})
            visit(child)

    visit(ast.parse(source))
    return found & set(modules)


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return components


def test_product_modules_import_no_circle() -> None:
    """No product module imports, when it is imported or in a function, one that imports it
    back: a lazy import is still a dependency, only deferred."""
    modules = _product_modules()
    graph = {m: _imports(p.read_text(encoding="utf-8"), modules) - {m} for m, p in modules.items()}
    assert _cycles(graph) == []


def test_the_import_graph_sees_lazy_imports_and_skips_annotations() -> None:
    source = (
        "from typing import TYPE_CHECKING\n"
        "import a\n"
        "from b import c\n"
        "if TYPE_CHECKING:\n    import d\n"
        "class K:\n    def m(self):\n        from e import f\n"
    )
    assert _imports(source, {"a", "b", "b.c", "d", "e"}) == {"a", "b.c", "e"}


def test_cycle_finder_finds_a_circle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


# ---------------------------------------------------------------------------- pipeline models

#: where code may ask which pipeline model it holds outside the registry: nowhere (every model,
#: the paper's included, is solved by solver/per_configuration.py)
MODEL_BRANCHES_ALLOWED = 0
_MODEL_BRANCH = re.compile(
    r"isinstance\([^)]*\b(PaperPipeline|AsyncCopyPipeline)\b"
    r"|[=!]=\s*[\"'](paper|async-copy)[\"']"
    r"|\bis(?: not)? PipelineModel\.\w+"
)


def test_no_place_branches_on_the_pipeline_model() -> None:
    """Outside the registry (perfmodel/pipelines), which model answers is read from the
    model object, never asked by type or name."""
    branches = []
    for module, path in _product_modules().items():
        if module.startswith("perfmodel.pipelines"):
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if _MODEL_BRANCH.search(line):
                branches.append(f"{path.relative_to(REPO)}:{number}: {line.strip()}")
    assert len(branches) <= MODEL_BRANCHES_ALLOWED, branches


def test_no_package_imports_another_packages_private_names() -> None:
    """A leading underscore is private to its package: perfmodel's encodings share their
    SMT-LIB helpers with solver through perfmodel/smtlib.py, not solver's internals."""
    crossings = []
    for module, path in _product_modules().items():
        package = module.split(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.ImportFrom) or node.level or not node.module:
                continue
            source = node.module.split(".")[0]
            if source == package or source not in PRODUCT_PACKAGES:
                continue
            private = [a.name for a in node.names if a.name.startswith("_")]
            if private:
                crossings.append(f"{module}: from {node.module} import {', '.join(private)}")
    assert crossings == []


# ---------------------------------------------------------------------------- layers

#: the server's own packages (kperf_client, the user side, is the product's other half)
SERVER_PACKAGES = ("app", "solver", "perfmodel", "render", "device_profiles")
#: what each package may import of the product beside itself (the standard library and
#: third-party packages are always allowed): the models at the bottom, the solver and the
#: pictures above them, the service on top; the user side knows nothing of the server
LAYERS: dict[str, frozenset[str]] = {
    "perfmodel": frozenset({"device_profiles"}),
    # the profiles' adapters (priors, SM limits, memory figures) build the models' inputs
    "device_profiles": frozenset({"perfmodel"}),
    "solver": frozenset({"perfmodel", "device_profiles"}),
    "render": frozenset({"perfmodel", "device_profiles"}),
    "app": frozenset(SERVER_PACKAGES),
    "kperf_client": frozenset(),
}
#: (module, package) pairs beyond :data:`LAYERS`: `kperf serve` runs the service and the
#: in-process client (no --url) builds it, lazily (LAZY_SERVER_IMPORTS above checks where)
LAYER_EXCEPTIONS = frozenset({("kperf_client.cli", "app"), ("kperf_client.client", "app")})


def _every_import(source: str, module: str) -> list[tuple[int, str]]:
    """(line, module) of every import of ``source`` (the module ``module``), at any depth:
    module level, inside functions and classes, and under ``if TYPE_CHECKING:``; a relative
    import is resolved against the package ``module`` is in."""
    tree = ast.parse(source)
    package = module.split(".")[:-1]
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package[: len(package) - (node.level - 1)]
                base = ".".join([*parent, base] if base else parent)
            found.append((node.lineno, base))
    return found


def layer_violations(sources: Mapping[str, str]) -> list[str]:
    """Every import in ``sources`` (module name -> its source) of a product package that
    :data:`LAYERS` does not allow the module's package."""
    violations = []
    for module, source in sorted(sources.items()):
        package = module.split(".")[0]
        allowed = LAYERS[package] | {package}
        for line, name in _every_import(source, module):
            target = name.split(".")[0]
            if target not in PRODUCT_PACKAGES or target in allowed:
                continue
            if (module, target) in LAYER_EXCEPTIONS:
                continue
            violations.append(
                f"{module}:{line}: imports {name} "
                f"({package} may import {', '.join(sorted(allowed))})"
            )
    return violations


def _product_sources() -> dict[str, str]:
    return {m: p.read_text(encoding="utf-8") for m, p in _product_modules().items()}


def test_every_package_imports_only_the_layers_below_it() -> None:
    """perfmodel imports nothing of the solver, the pictures or the service (a model's Z3
    encoding lives in solver/encodings, its picture in render/pipeline.py); solver and render
    import only the models and the profiles; the user side imports nothing of the server
    (but for the documented entry points). Lazy and annotation-only imports count."""
    assert set(LAYERS) == set(PRODUCT_PACKAGES)
    assert layer_violations(_product_sources()) == []


def test_the_layer_check_reports_an_upward_import() -> None:
    sources = _product_sources()
    seeded = "perfmodel.pipelines.paper"
    sources[seeded] += (
        "\nfrom typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from solver.encoding import Encoding\n"
        "def _picture():\n    import render.timeline\n"
    )
    found = layer_violations(sources)
    assert [v.split(": imports ")[1].split(" ")[0] for v in found] == [
        "solver.encoding",
        "render.timeline",
    ]
    assert all(v.startswith(f"{seeded}:") for v in found)
    # the synthetic module of a package, and a relative import resolved to its package
    assert layer_violations({"perfmodel.fake": "from solver.encoding import Encoding\n"}) == [
        "perfmodel.fake:1: imports solver.encoding (perfmodel may import device_profiles, "
        "perfmodel)"
    ]
    assert layer_violations({"render.fake": "from ..app import main\n"}) == [
        "render.fake:1: imports app (render may import device_profiles, perfmodel, render)"
    ]
    assert layer_violations({"kperf_client.sweep.fake": "import numpy, solver\n"}) != []


def _app_graph(sources: Mapping[str, str]) -> dict[str, set[str]]:
    """The import graph of the app/ modules in ``sources``: every import, at module level, in
    functions and under ``if TYPE_CHECKING:`` (``from package import submodule`` imports the
    submodule)."""
    modules = {m for m in sources if m == "app" or m.startswith("app.")}
    graph: dict[str, set[str]] = {}
    for module in sorted(modules):
        edges: set[str] = set()
        for node in ast.walk(ast.parse(sources[module])):
            if isinstance(node, ast.Import):
                edges.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                submodules = {f"{node.module}.{a.name}" for a in node.names}
                edges.update(submodules & modules or {node.module})
        graph[module] = (edges & modules) - {module}
    return graph


def test_the_service_modules_import_no_circle_even_for_annotations() -> None:
    """No app/ module imports one that imports it back, even under ``if TYPE_CHECKING:`` (the
    service types its inline runner with its own protocol, ``app.service.SmallSolves``)."""
    assert _cycles(_app_graph(_product_sources())) == []


def test_the_app_cycle_check_sees_an_annotation_only_import() -> None:
    sources = {
        "app.service": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
        "    from app.inline import InlineRunner\n",
        "app.inline": "from app.service import Service\n",
    }
    assert _cycles(_app_graph(sources)) == [["app.inline", "app.service"]]
