"""Container figures: build times, image size over its base, start-to-healthy, stop.

On the engine the smoke test uses (a private dockerd when run as root; tests/container_engine.py):
builds the offline base once (``scripts/offline-base-image.sh``, timed), then the image
``--builds`` times without the layer cache (``scripts/build-image.sh --no-cache``), then starts
the image ``--starts`` times (fresh container and volume, one worker, host network) and times
``docker run`` -> /readyz answers 200, and -> Docker's HEALTHCHECK reports healthy (its first
probe comes one interval, 5 s, after the start), and ``docker stop`` (SIGTERM -> exit).
Prints medians (min-max); everything it started is removed. Acceptance: image over base
<= 150 MB besides the numerical and plotting stack (exit status 1 if not).

    .venv/bin/python bench/bench_container.py --builds 3 --starts 5
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
# run as a script (bench/ on sys.path): the engine helper lives in the tests package
sys.path.insert(0, str(REPO))
from bench.common import command_line  # noqa: E402
from tests.app.service_helpers import free_port  # noqa: E402
from tests.container_engine import Engine, build_base_image, build_image, open_engine  # noqa: E402
from tests.test_container import NUMERIC_PACKAGES  # noqa: E402

#: besides the numerical and plotting stack (tests/test_container.py)
MAX_OVER_BASE_BYTES = 150 * 1000 * 1000


def _timed(fn: Callable[..., object], *args: object) -> float:
    t0 = time.monotonic()
    fn(*args)
    return time.monotonic() - t0


def _start_once(engine: Engine, image: str, run: int) -> tuple[float, float, float]:
    name, port = f"{engine.prefix}-start-{run}", free_port()
    t0 = time.monotonic()
    engine.docker(
        *("run", "-d", "--name", name, "--network", "host"),
        *("-e", "KPERF_HOST=127.0.0.1", "-e", f"KPERF_PORT={port}", "-e", "KPERF_WORKERS=1"),
        *("-v", f"{engine.prefix}-cache-{run}:/var/cache/kperf"),
        image,
    )
    ready_s = None
    with httpx.Client(timeout=2) as http:
        while ready_s is None and time.monotonic() - t0 < 120:
            try:
                if http.get(f"http://127.0.0.1:{port}/readyz").status_code == 200:
                    ready_s = time.monotonic() - t0
            except httpx.HTTPError:
                time.sleep(0.05)
    if ready_s is None:
        raise RuntimeError(f"{name} did not answer /readyz within 120 s")
    engine.wait_healthy(name)
    healthy_s = time.monotonic() - t0
    stop_s = _timed(engine.docker, "stop", "-t", "10", name)
    code = engine.inspect(name, "{{.State.ExitCode}}")
    if code != "0":
        raise RuntimeError(f"{name} exited {code} on docker stop")
    engine.docker("rm", "-v", name)
    return ready_s, healthy_s, stop_s


def _summary(values: list[float], unit: str = "s") -> str:
    return (
        f"{statistics.median(values):.1f} {unit} "
        f"({min(values):.1f}-{max(values):.1f}, n={len(values)})"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--builds", type=int, default=3, help="image builds without cache")
    parser.add_argument("--starts", type=int, default=5, help="container starts")
    parser.add_argument("--base-tarball", default=None, help="reuse/keep the base root fs here")
    args = parser.parse_args()

    engine = open_engine()
    try:
        base = f"{engine.prefix}-base:latest"
        base_s = _timed(build_base_image, engine, base, args.base_tarball)
        image = f"{engine.prefix}-kperf:latest"
        builds = [
            _timed(build_image, engine, base, image, "--no-cache") for _ in range(args.builds)
        ]
        base_bytes = engine.image_size_bytes(base)
        image_bytes = engine.image_size_bytes(image)
        numeric_bytes = engine.installed_bytes(image, NUMERIC_PACKAGES)
        starts = [_start_once(engine, image, run) for run in range(args.starts)]
    finally:
        cleanup_s = _timed(engine.close)

    over = image_bytes - base_bytes - numeric_bytes
    print(f"command: {command_line()}")
    print(f"engine: {'private dockerd' if engine.private else engine.docker_host}")
    print(f"offline base image (debootstrap + import): {base_s:.1f} s, {base_bytes / 1e6:.0f} MB")
    print(f"image build, no cache: {_summary(builds)}")
    print(
        f"image: {image_bytes / 1e6:.0f} MB, over its base: {over / 1e6:.0f} MB "
        f"besides the numerical and plotting stack ({numeric_bytes / 1e6:.0f} MB)"
    )
    print(f"docker run -> /readyz 200: {_summary([s[0] for s in starts])}")
    print(f"docker run -> HEALTHCHECK healthy: {_summary([s[1] for s in starts])}")
    print(f"docker stop (SIGTERM -> exit 0): {_summary([s[2] for s in starts])}")
    print(f"cleanup (remove images, stop the daemon): {cleanup_s:.1f} s")
    return 0 if over <= MAX_OVER_BASE_BYTES else 1


if __name__ == "__main__":
    sys.exit(main())
