#!/usr/bin/env bash
# Build the kperf image the way this machine reaches PyPI: `docker build` on the host network
# (a private daemon may have no bridge), with this host's pip index settings and proxy variables
# forwarded as build arguments, read at run time (the repository names no host).
#
# Usage: scripts/build-image.sh [--base IMAGE] [--tag TAG] [-- extra docker build arguments]
#   --base IMAGE   BASE_IMAGE of the Dockerfile (default: the Dockerfile's, python:3.11-slim);
#                  e.g. the tag scripts/offline-base-image.sh printed
#   --tag TAG      image tag (default kperf:local)
# Forwarded when set on this host: pip's index-url, extra-index-url and trusted-host (from
# `pip config list`: PIP_* variables and pip.conf; file:// indexes are left out, they are
# paths on this machine), and HTTP(S)_PROXY / NO_PROXY (which docker keeps out of the image's
# history). CA certificates come with the base image (scripts/offline-base-image.sh).
set -euo pipefail
cd "$(dirname "$0")/.."

base="" tag="kperf:local"
while (($#)); do
    case "$1" in
        --base) base="$2"; shift 2 ;;
        --tag) tag="$2"; shift 2 ;;
        --) shift; break ;;
        -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "unknown argument: $1 (see --help)" >&2; exit 2 ;;
    esac
done

args=(--network host --tag "$tag")
[[ -z "$base" ]] || args+=(--build-arg "BASE_IMAGE=$base")

# pip's effective settings here: `pip config list` prints section.key='value', the :env:
# section being PIP_* variables, which win over the install section, which wins over global
pip_config="$(python3 -m pip config list 2>/dev/null || true)"
pip_setting() {
    local section value
    for section in ':env:' install global; do
        value="$(awk -v k="$section.$1" 'index($0, k "=") == 1 { print substr($0, length(k) + 2) }' \
            <<<"$pip_config" | tail -n 1)"
        value="${value#\'}" value="${value%\'}"
        if [[ -n "$value" ]]; then echo "$value"; return; fi
    done
}
without_local() { tr ' ' '\n' | grep -v -e '^file:' -e '^/' -e '^$' | paste -sd ' ' || true; }

index_url="$(pip_setting index-url | without_local)"
extra_index_url="$(pip_setting extra-index-url | without_local)"
trusted_host="$(pip_setting trusted-host)"
[[ -z "$index_url" ]] || args+=(--build-arg "PIP_INDEX_URL=$index_url")
[[ -z "$extra_index_url" ]] || args+=(--build-arg "PIP_EXTRA_INDEX_URL=$extra_index_url")
[[ -z "$trusted_host" ]] || args+=(--build-arg "PIP_TRUSTED_HOST=$trusted_host")
for var in HTTP_PROXY HTTPS_PROXY NO_PROXY http_proxy https_proxy no_proxy; do
    [[ -z "${!var:-}" ]] || args+=(--build-arg "$var=${!var}")
done

exec docker build "${args[@]}" "$@" .
