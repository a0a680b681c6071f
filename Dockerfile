# kperf service image: the service alone (no dev extras), non-root, health-checked.
#   docker build -t kperf .                        (base: the official slim Python image)
#   scripts/offline-base-image.sh && scripts/build-image.sh --base kperf-base:bookworm
#                                                  (no registry: a debootstrapped Debian)
# Works with the classic builder and BuildKit (no RUN --mount, no remote syntax frontend).
# Any base with python3 >= 3.11 (with venv), sh, useradd and CA certificates will do.
ARG BASE_IMAGE=python:3.11-slim

FROM ${BASE_IMAGE} AS build
# marks the classic builder's untagged build-stage image: docker image prune --filter label=...
LABEL kperf.stage=build
# the host's pip index settings, forwarded by scripts/build-image.sh when it has any; they
# live in this stage only, which is not part of the image
ARG PIP_INDEX_URL
ARG PIP_EXTRA_INDEX_URL
ARG PIP_TRUSTED_HOST
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1 PIP_NO_INPUT=1
RUN python3 -m venv /opt/kperf
WORKDIR /src
COPY pyproject.toml README.md ./
COPY app ./app
COPY solver ./solver
COPY perfmodel ./perfmodel
COPY device_profiles ./device_profiles
COPY render ./render
# the kperf command (kperf serve): the user-side package holds the command line
COPY kperf_client ./kperf_client
# A regular (not editable) install of the service alone: the server extra, no dev tools. pip
# trusts the system CA store, which the offline base extends with the site's CAs. pip itself
# is not needed at run time, nor are the test suites that numpy, scipy and matplotlib ship
# inside their packages (~55 MB).
RUN if [ -f /etc/ssl/certs/ca-certificates.crt ]; then \
        export PIP_CERT=/etc/ssl/certs/ca-certificates.crt; fi \
    && /opt/kperf/bin/pip install -q '.[server]' \
    && /opt/kperf/bin/pip uninstall -q -y pip setuptools \
    && find /opt/kperf/lib -depth -type d -name tests -path '*/site-packages/*' \
        -exec rm -rf {} +

FROM ${BASE_IMAGE} AS runtime
# a fixed numeric uid, so orchestrators can check runAsNonRoot and volumes can be pre-owned
RUN groupadd --system --gid 10001 kperf \
    && useradd --system --uid 10001 --gid kperf --home-dir /nonexistent --no-create-home \
        --shell /usr/sbin/nologin kperf \
    && mkdir -p /var/cache/kperf && chown kperf:kperf /var/cache/kperf
COPY --from=build /opt/kperf /opt/kperf
ENV PATH=/opt/kperf/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    KPERF_HOST=0.0.0.0 \
    KPERF_PORT=8000 \
    KPERF_WORKERS=2 \
    KPERF_CACHE_PATH=/var/cache/kperf/results.sqlite3 \
    KPERF_LOG_JSON=true \
    MPLCONFIGDIR=/var/cache/kperf/matplotlib
# the persistent result cache: a restarted container answers known problems without solving
VOLUME ["/var/cache/kperf"]
USER 10001:10001
EXPOSE 8000
# kperf is PID 1 (exec form): on SIGTERM uvicorn drains requests, the lifespan stops the worker
# pool and closes the cache, and the process exits 0
STOPSIGNAL SIGTERM
# healthy = ready to answer (profiles loaded, Z3 usable, worker pool alive), on KPERF_PORT
HEALTHCHECK --interval=5s --timeout=4s --start-period=60s --retries=3 \
    CMD ["python", "-c", "import os, sys, urllib.request as u; u.urlopen('http://127.0.0.1:%s/readyz' % os.environ.get('KPERF_PORT', '8000'), timeout=3); sys.exit(0)"]
# Authentication (README, "Run it for a team"): mount the hashed tokens file as a secret, e.g.
# -v $PWD/tokens:/run/secrets/kperf_tokens:ro -e KPERF_TOKENS_FILE=/run/secrets/kperf_tokens;
# the image listens on 0.0.0.0, so without it anyone who reaches the port may write
CMD ["kperf", "serve"]
