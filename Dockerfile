# syntax=docker/dockerfile:1
# kperf service image. Build stage installs with the README's install line, unchanged; the
# runtime stage copies the installed tree (same path: the venv's scripts use absolute paths).

FROM python:3.11-slim AS build
WORKDIR /opt/kperf
COPY pyproject.toml README.md ./
COPY app ./app
COPY solver ./solver
COPY perfmodel ./perfmodel
COPY device_profiles ./device_profiles
# Same as README.md's install step:
RUN python3 -m venv .venv && .venv/bin/pip install -q -e '.[dev]'

FROM python:3.11-slim AS runtime
RUN groupadd --system kperf && useradd --system --gid kperf --home-dir /opt/kperf kperf \
    && mkdir -p /var/cache/kperf && chown kperf:kperf /var/cache/kperf
COPY --from=build --chown=root:root /opt/kperf /opt/kperf
WORKDIR /opt/kperf
ENV PYTHONUNBUFFERED=1 \
    KPERF_WORKERS=2 \
    KPERF_CACHE_PATH=/var/cache/kperf/results.sqlite3 \
    KPERF_LOG_JSON=true
VOLUME ["/var/cache/kperf"]
USER kperf
EXPOSE 8000
HEALTHCHECK --interval=15s --timeout=5s --start-period=30s --retries=3 \
    CMD ["/opt/kperf/.venv/bin/python", "-c", "import sys, urllib.request; sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:8000/healthz', timeout=4).status == 200 else 1)"]
# KPERF_WORKERS (and every other KPERF_* setting) is read from the environment at start-up
CMD ["/opt/kperf/.venv/bin/kperf", "serve", "--host", "0.0.0.0", "--port", "8000"]
