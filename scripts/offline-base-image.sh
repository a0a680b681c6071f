#!/usr/bin/env bash
# Make the base image of the kperf Dockerfile without a container registry (air-gapped sites):
# a minimal Debian (debootstrap --variant=minbase) with python3, python3-venv and this
# machine's trusted CA certificates, imported with `docker import`. Then:
#   docker build --build-arg BASE_IMAGE=<the tag printed> -t kperf .
#
# Usage: scripts/offline-base-image.sh [--mirror URL] [--suite NAME] [--tag TAG]
#                                      [--tarball FILE] [--ca-dir DIR] [--no-upgrade]
#   --mirror, --suite  Debian mirror and suite; default: the ones apt on this machine uses
#                      (apt-get indextargets), so the script names no host itself
#   --tag              image tag (default kperf-base:SUITE)
#   --tarball FILE     import FILE if it exists (no download); otherwise also save the root
#                      file system there, for the next run
#   --ca-dir DIR       extra CA certificates (*.crt) to trust (default
#                      /usr/local/share/ca-certificates): sites behind an intercepting proxy
#                      need them for pip inside `docker build`
#   --no-upgrade       skip applying SUITE-updates / SUITE-security from apt's configuration
# Needs root, debootstrap, and a docker CLI that reaches a daemon (DOCKER_HOST is honoured).
# Prints the image tag on its last line of stdout.
set -euo pipefail

mirror="" suite="" tag="" tarball="" ca_dir=/usr/local/share/ca-certificates upgrade=1
while (($#)); do
    case "$1" in
        --mirror) mirror="$2"; shift 2 ;;
        --suite) suite="$2"; shift 2 ;;
        --tag) tag="$2"; shift 2 ;;
        --tarball) tarball="$2"; shift 2 ;;
        --ca-dir) ca_dir="$2"; shift 2 ;;
        --no-upgrade) upgrade=0; shift ;;
        -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "unknown argument: $1 (see --help)" >&2; exit 2 ;;
    esac
done

log() { echo "offline-base-image: $*" >&2; }

# apt's Debian package sources on this machine: "URI SUITE" per line (from its configuration
# alone: --no-release-info needs no downloaded package lists)
apt_sources() {
    # shellcheck disable=SC2016 # $(...) are apt's format fields, not shell
    apt-get indextargets --no-release-info \
        --format '$(REPO_URI) $(RELEASE) $(TARGET_OF) $(IDENTIFIER)' 2>/dev/null |
        awk '$3 == "deb" && $4 == "Packages" { print $1, $2 }' | sort -u
}

if [[ -z "$suite" || -z "$mirror" ]]; then
    sources="$(apt_sources)"
    if [[ -z "$suite" ]]; then
        # shellcheck disable=SC1091
        codename="$(. /etc/os-release && echo "${VERSION_CODENAME:-}")"
        # the release suite (not -updates / -security), preferring this machine's own codename
        suite="$(awk -v c="$codename" '$2 == c { print $2; exit }' <<<"$sources")"
        [[ -n "$suite" ]] || suite="$(awk '$2 !~ /-/ { print $2; exit }' <<<"$sources")"
    fi
    if [[ -z "$mirror" ]]; then
        mirror="$(awk -v s="$suite" '$2 == s { print $1; exit }' <<<"$sources")"
    fi
    if [[ -z "$suite" || -z "$mirror" ]]; then
        echo "cannot read a Debian mirror and suite from apt's configuration" \
            "(give --mirror URL --suite NAME)" >&2
        exit 2
    fi
fi
tag="${tag:-kperf-base:$suite}"
# the image configuration a registry's debian image would carry
changes=(
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin'
    --change 'ENV LANG=C.UTF-8'
    --change 'CMD ["/bin/bash"]'
)

if [[ -n "$tarball" && -s "$tarball" ]]; then
    log "importing $tarball as $tag (no download)"
    docker import "${changes[@]}" "$tarball" "$tag" >/dev/null
    echo "$tag"
    exit 0
fi

[[ $EUID -eq 0 ]] || { echo "debootstrap needs root" >&2; exit 2; }
command -v debootstrap >/dev/null || { echo "debootstrap not found (apt-get install debootstrap)" >&2; exit 2; }

work="$(mktemp -d "${TMPDIR:-/tmp}/kperf-base.XXXXXX")"
# commands run inside the new root (debootstrap's own chroot steps included) see the root's
# /tmp: a TMPDIR of this machine names a folder the chroot does not have (apt, dpkg and
# update-ca-certificates then fail to make their temporary files)
in_root() { env -u TMPDIR -u TMP -u TEMP chroot "$root" "$@"; }
root="$work/rootfs"
cleanup() {
    # debootstrap mounts /proc, /sys (and may bind /dev) inside the target; a failed run can
    # leave them: unmount before deleting, and never cross into another file system
    local mnt
    while read -r mnt; do umount -l "$mnt" 2>/dev/null || true; done < <(
        awk -v r="$root" 'index($2, r) == 1 { print $2 }' /proc/mounts | sort -r
    )
    rm -rf --one-file-system "$work"
}
trap cleanup EXIT

log "debootstrap --variant=minbase $suite from $mirror"
env -u TMPDIR -u TMP -u TEMP debootstrap --variant=minbase \
    --include=python3,python3-venv,ca-certificates \
    "$suite" "$root" "$mirror" >"$work/debootstrap.log" 2>&1 || {
    tail -n 20 "$work/debootstrap.log" >&2
    exit 1
}

if ((upgrade)); then
    # security and stable updates, from the same sources apt uses here (SUITE-security, ...)
    extra="$(apt_sources | awk -v s="$suite" 'index($2, s "-") == 1 { print "deb", $1, $2, "main" }')"
    if [[ -n "$extra" ]]; then
        log "applying $(awk '{ printf "%s ", $3 }' <<<"$extra")"
        printf '%s\n' "$extra" >"$root/etc/apt/sources.list.d/updates.list"
        {
            in_root apt-get -q update &&
                DEBIAN_FRONTEND=noninteractive in_root apt-get -q -y upgrade
        } >"$work/upgrade.log" 2>&1 || { tail -n 20 "$work/upgrade.log" >&2; exit 1; }
    fi
fi

if [[ -d "$ca_dir" ]] && find "$ca_dir" -name '*.crt' -print -quit | grep -q .; then
    log "adding the CA certificates of $ca_dir"
    cp -r "$ca_dir"/. "$root/usr/local/share/ca-certificates/"
    in_root update-ca-certificates >"$work/ca.log" 2>&1 || { cat "$work/ca.log" >&2; exit 1; }
fi

# what an image does not need: package lists and archives, docs, man pages, translations,
# and this machine's resolver and host name (the engine provides its own at run time)
in_root apt-get clean
rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin "$root"/var/log/*.log \
    "$root"/usr/share/doc/* "$root"/usr/share/man/* "$root"/usr/share/info/* \
    "$root"/usr/share/locale/*
: >"$root/etc/resolv.conf"
: >"$root/etc/hostname"

out="$work/rootfs.tar"
tar --numeric-owner -C "$root" -cf "$out" .
if [[ -n "$tarball" ]]; then
    cp "$out" "$tarball.part" && mv "$tarball.part" "$tarball"
fi
log "importing as $tag ($(du -h "$out" | cut -f1) root file system)"
docker import "${changes[@]}" "$out" "$tag" >/dev/null
echo "$tag"
