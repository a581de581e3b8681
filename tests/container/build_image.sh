#!/usr/bin/env bash
# Build the project's image with podman, on a base made here (no registry needed), for the container tier.
#
#   tests/container/build_image.sh [IMAGE]        # default localhost/isoprobe:test
#
# Why a local base: the Dockerfile's default base (python:3.11-slim) lives in a registry that CI machines
# cannot reach. debootstrap makes a Debian minbase root (with python3 and python3-venv) from the Debian
# mirror the machine's own apt sources name; `podman import` turns it into an image; a small layer on top
# puts a venv's python and pip first on PATH, as python:*-slim has them in /usr/local/bin. The Dockerfile
# is then built unchanged, with BASE_IMAGE pointing at that stand-in. An existing base is reused.
#
# Flags needed on these machines (measured, ../shared/notes/containers.md): runtime runc (crun refuses the
# hybrid cgroup layout); explicit ulimits (the runtime cannot copy the host's); host network, the host's CA
# store and pip.conf mounted for the build only (pip then reaches the package index as the host does; nothing
# of them is baked into the image). Prints "base built in Ns" / "image built in Ns" for the CI log.
set -euo pipefail
cd "$(dirname "$0")/../.."

IMAGE="${1:-localhost/isoprobe:test}"
BASE="${ISOPROBE_CONTAINER_BASE:-localhost/isoprobe-test-base:bookworm}"
SUITE="$(. /etc/os-release && echo "${VERSION_CODENAME:-bookworm}")"
PODMAN=(podman --runtime runc)
work=""
pinfile=""
trap 'rm -rf ${work:+"$work"} ${pinfile:+"$pinfile"}' EXIT
LIMITS=(--ulimit nofile=1024:1024 --ulimit nproc=1024:1024)

# The Debian mirror of the machine's apt sources (deb822 .sources or one-line sources.list), else Debian's CDN.
mirror() {
    local found=""
    found="$(awk '/^URIs:/ {print $2}' /etc/apt/sources.list.d/*.sources 2>/dev/null \
        | grep -v security | grep -m1 '/debian/\?$' || true)"
    [ -n "$found" ] || found="$(awk '$1 == "deb" && $2 !~ /^\[/ {print $2}' /etc/apt/sources.list 2>/dev/null \
        | grep -v security | grep -m1 '/debian/\?$' || true)"
    echo "${found:-http://deb.debian.org/debian}"
}

if ! "${PODMAN[@]}" image exists "$BASE"; then
    began=$SECONDS
    work="$(mktemp -d /var/tmp/isoprobe-base.XXXXXX)"
    debootstrap --variant=minbase --include=python3,python3-venv "$SUITE" "$work/rootfs" "$(mirror)" >/dev/null
    tar -C "$work/rootfs" -c . | "${PODMAN[@]}" import - "$BASE-rootfs" >/dev/null
    rm -rf "$work/rootfs"
    # The stand-in for python:3.11-slim: `python` and `pip` on PATH, pip installing into a venv.
    cat > "$work/Containerfile" <<EOF
FROM $BASE-rootfs
RUN python3 -m venv /usr/local/py && ln -s /usr/local/py/bin/python /usr/local/py/bin/pip /usr/local/bin/
ENV PATH=/usr/local/py/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
CMD ["python3"]
EOF
    "${PODMAN[@]}" build "${LIMITS[@]}" --network host -t "$BASE" "$work" >/dev/null
    echo "base built in $((SECONDS - began))s: $BASE (debootstrap $SUITE from $(mirror))"
else
    echo "base reused: $BASE"
fi

MOUNTS=()
[ -d /etc/ssl/certs ] && MOUNTS+=(-v /etc/ssl/certs:/etc/ssl/certs:ro)
[ -f /etc/pip.conf ] && MOUNTS+=(-v /etc/pip.conf:/etc/pip.conf:ro)

# The image gets the torch and torchvision releases of the host's tests, not whatever the index offers that day:
# a new torch release once made the image's CUDA libraries outgrow a CI machine's disk mid-build while the host's
# tests ran on the older one. Where the python3 on PATH has torch (a venv), its releases; where it has none yet
# (CI builds the image before it makes its venv, to keep the venv's 6 GB off the build's peak), the releases its
# pip resolves for the project's dependencies now, under the same constraints the venv's install then obeys.
PINS=()
pins="$(python3 - 2>/dev/null <<'EOF' || true
from importlib.metadata import version
for name in ("torch", "torchvision"):
    print(f"{name}=={version(name).split('+')[0]}")
EOF
)"
pinned_from="the host's"
if [ -z "$pins" ]; then
    report="$(mktemp /var/tmp/isoprobe-resolve.XXXXXX)"
    python3 -m pip install --dry-run --ignore-installed --quiet --report "$report" . >/dev/null 2>&1 || true
    pins="$(python3 - "$report" 2>/dev/null <<'EOF' || true
import json, sys
installs = {item["metadata"]["name"].lower(): item["metadata"]["version"] for item in json.load(open(sys.argv[1]))["install"]}
for name in ("torch", "torchvision"):
    print(f"{name}=={installs[name].split('+')[0]}")
EOF
)"
    rm -f "$report"
    pinned_from="pip's resolution of"
fi
if [ -z "$pins" ]; then
    echo "build_image.sh: no torch release to pin the image to: python3 on PATH has no torch, and its pip resolved" \
        "none for the project (an unpinned image takes the index's newest torch, which the host's tests never ran)" >&2
    exit 1
else
    pinfile="$(mktemp /var/tmp/isoprobe-pins.XXXXXX)"
    echo "$pins" > "$pinfile"
    MOUNTS+=(-v "$pinfile:/tmp/isoprobe-pins.txt:ro")
    PINS=(--build-arg PIP_CONSTRAINT=/tmp/isoprobe-pins.txt)
    echo "pinned to $pinned_from $(echo "$pins" | paste -sd' ')"
fi
# Committing the image's layer takes about 3.6 times its size at the peak (measured 2026-11-30: 22.2 GB above
# the base for the 6.1 GB image): the container's files, buildah's diff in TMPDIR, containers/storage's copy of it,
# and the new layer. A build that runs out of disk says so in podman's words; these lines say how much there was.
graphroot="$("${PODMAN[@]}" info --format '{{.Store.GraphRoot}}')"
avail() { df -h --output=avail "$1" | tail -1 | tr -d ' '; }
echo "disk: $(avail "$graphroot") free at $graphroot, $(avail "${TMPDIR:-/var/tmp}") at ${TMPDIR:-/var/tmp}, before the image build"
trap 'rm -rf ${work:+"$work"} ${pinfile:+"$pinfile"}; echo "disk: $(avail "$graphroot") free at $graphroot after the image build"' EXIT
replaced="$("${PODMAN[@]}" image inspect --format '{{.Id}}' "$IMAGE" 2>/dev/null || true)"
began=$SECONDS
"${PODMAN[@]}" build "${LIMITS[@]}" --network host "${MOUNTS[@]}" "${PINS[@]}" \
    --build-arg BASE_IMAGE="$BASE" -t "$IMAGE" -f Dockerfile .
echo "image built in $((SECONDS - began))s: $IMAGE ($("${PODMAN[@]}" image inspect --format '{{.Size}}' "$IMAGE") bytes)"
# The image this build took the name from is garbage now (6 GB): removed, with the layers only it held. Those it
# shares with the new one (the base, the dependencies' layer when pyproject.toml is unchanged) stay.
if [ -n "$replaced" ] && [ "$replaced" != "$("${PODMAN[@]}" image inspect --format '{{.Id}}' "$IMAGE")" ]; then
    "${PODMAN[@]}" rmi "$replaced" >/dev/null 2>&1 && echo "removed the image it replaced: ${replaced:0:12}" || true
fi
