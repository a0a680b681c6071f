"""Settings: environment, validation, and the README/Dockerfile staying in step with them."""

from __future__ import annotations

import re

import pytest
from pydantic import ValidationError

from app.settings import Settings
from tests.app.service_helpers import REPO, clean_environ

__all__ = ["clean_environ"]

TEST_COMMAND = (
    "python3 -m venv .venv && .venv/bin/pip install -q -e '.[dev]' && .venv/bin/python -m pytest -q"
)


def test_environment_variables_with_prefix_are_read(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KPERF_WORKERS", "3")
    monkeypatch.setenv("KPERF_CACHE_PATH", "/tmp/x.sqlite3")
    monkeypatch.setenv("KPERF_LOG_LEVEL", "debug")
    monkeypatch.setenv("WORKERS", "9")  # no prefix: ignored
    settings = Settings()
    assert settings.workers == 3
    assert str(settings.cache_path) == "/tmp/x.sqlite3"
    assert settings.log_level == "DEBUG"


@pytest.mark.parametrize(
    ("env", "field"),
    [
        ({"KPERF_WORKERS": "0"}, "workers"),  # a pool needs a worker
        ({"KPERF_DEFAULT_TIME_LIMIT_S": "200"}, "default_time_limit_s"),  # above the max
        ({"KPERF_WORKER_MEMORY_LIMIT_BYTES": "1000"}, "worker_memory_limit_bytes"),  # can't load Z3
        ({"KPERF_MAX_PTX_BYTES": "9000000"}, "max_ptx_bytes"),  # larger than any body
        ({"KPERF_LOG_LEVEL": "LOUD"}, "log_level"),
    ],
)
def test_unsafe_values_are_refused_naming_the_setting(
    env: dict[str, str], field: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(ValidationError) as info:
        Settings()
    assert field in str(info.value)


def test_empty_cache_path_disables_persistence(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KPERF_CACHE_PATH", "")
    assert Settings().cache_path is None


def test_readme_configuration_table_lists_every_setting_with_its_default() -> None:
    page = (REPO / "docs" / "configuration.md").read_text(encoding="utf-8")
    section = page.split("# Configuration", 1)[1].split("\n## ", 1)[0]
    rows = dict(re.findall(r"^\| `KPERF_([A-Z_]+)` \| ([^|]+) \|", section, flags=re.M))
    assert set(rows) == {name.upper() for name in Settings.model_fields}
    for name, field in Settings.model_fields.items():
        shown = rows[name.upper()].strip()
        if field.default is None:
            assert shown == "unset"
        else:
            assert shown.strip("`").lower() == str(field.default).lower(), name


def test_image_installs_the_service_alone_and_ci_runs_the_readme_test_command() -> None:
    # the image carries no dev extras and no editable install; the README's test
    # command installs them, and .ci/run runs exactly that command
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    dockerfile = (REPO / "Dockerfile").read_text(encoding="utf-8")
    ci_run = (REPO / ".ci" / "run").read_text(encoding="utf-8")
    assert TEST_COMMAND in readme
    assert ci_run.rstrip().splitlines()[-1] == TEST_COMMAND
    installs = [line for line in dockerfile.splitlines() if "pip install" in line]
    assert installs and all("[dev]" not in line and " -e " not in line for line in installs)
    for directive in (
        "ARG BASE_IMAGE=",
        "USER 10001:10001",
        "HEALTHCHECK",
        "STOPSIGNAL SIGTERM",
        'VOLUME ["/var/cache/kperf"]',
        "EXPOSE 8000",
    ):
        assert directive in dockerfile


def test_dockerfile_copies_every_package_the_project_installs() -> None:
    pyproject = (REPO / "pyproject.toml").read_text(encoding="utf-8")
    include = re.search(r"^include = \[(.*)\]$", pyproject, flags=re.M)
    assert include is not None
    packages = [p.strip(' "*') for p in include[1].split(",")]
    dockerfile = (REPO / "Dockerfile").read_text(encoding="utf-8")
    missing = [p for p in packages if f"COPY {p} ./{p}\n" not in dockerfile]
    assert missing == []
