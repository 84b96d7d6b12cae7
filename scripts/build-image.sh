#!/usr/bin/env bash
# Build the fabricmon image with buildah (Debian's package: apt-get install buildah mmdebstrap; as root):
# the pinned base root filesystem first (scripts/build-base.sh), then the Containerfile.
#
#   scripts/build-image.sh [TAG]    # TAG defaults to ghcr.io/gpu-fabricmon/gpu-fabricmon:<version>
#
# The storage driver is vfs (works on any filesystem, no fuse-overlayfs needed) and RUN steps use
# chroot isolation: both work where no container runtime can (tests/deploy/test_image.py, deploy/README.md).
# FABRICMON_BUILDAH_STORAGE overrides the driver.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v buildah >/dev/null || { echo "build-image: needs buildah (apt-get install buildah)" >&2; exit 2; }
version=$(sed -n 's/^__version__ = "\(.*\)"$/\1/p' fabricmon/__init__.py)
tag=${1:-ghcr.io/gpu-fabricmon/gpu-fabricmon:$version}
revision=$(git rev-parse HEAD 2>/dev/null || echo unknown)
bash scripts/build-base.sh build/image/rootfs.tar
# Where PyPI is reached through a TLS-inspecting proxy, the host's CA bundle (pip's $PIP_CERT, else
# $SSL_CERT_FILE) is mounted into the RUN steps only, and named to pip there by the PIP_CERT build arg;
# it is in no layer of the image.
ca=()
cert=${PIP_CERT:-${SSL_CERT_FILE:-}}
if [ -n "$cert" ] && [ -f "$cert" ]; then
  ca=(--volume "$cert:/run/build-ca.crt:ro" --build-arg PIP_CERT=/run/build-ca.crt)
fi
buildah --storage-driver "${FABRICMON_BUILDAH_STORAGE:-vfs}" bud --isolation chroot --layers=false "${ca[@]}" \
  --build-arg REVISION="$revision" --build-arg VERSION="$version" -t "$tag" -f Containerfile .
echo "build-image: $tag"
