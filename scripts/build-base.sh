#!/usr/bin/env bash
# Make the image's base root filesystem from Debian's archive with mmdebstrap, as pinned in
# deploy/image/base.env, and check its sha256 (apt-get install mmdebstrap; as root).
#
#   scripts/build-base.sh [OUT]     # OUT defaults to build/image/rootfs.tar (what the Containerfile ADDs)
#
# The mirror is snapshot.debian.org at DEBIAN_SNAPSHOT where it is reachable, else deb.debian.org, whose
# bookworm gives the same bytes until its next update (then the sha256 differs: the build stops and
# scripts/pin-base-image.sh re-pins).  FABRICMON_DEBIAN_MIRROR overrides the mirror.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-build/image/rootfs.tar}
# shellcheck source=/dev/null
. deploy/image/base.env
: "${FABRICMON_BASE_EXPECT_SHA256=$BASE_ROOTFS_SHA256}"
command -v mmdebstrap >/dev/null || { echo "build-base: needs mmdebstrap (apt-get install mmdebstrap)" >&2; exit 2; }
mirror=${FABRICMON_DEBIAN_MIRROR:-}
if [ -z "$mirror" ]; then
  snap="https://snapshot.debian.org/archive/debian/$DEBIAN_SNAPSHOT"
  if curl -fsS -m 15 -o /dev/null "$snap/dists/$DEBIAN_SUITE/Release" 2>/dev/null; then mirror=$snap
  else mirror=http://deb.debian.org/debian; fi
fi
mkdir -p "$(dirname "$out")"
if [ -f "$out" ] && [ -n "$FABRICMON_BASE_EXPECT_SHA256" ] \
   && [ "$(sha256sum < "$out" | cut -d' ' -f1)" = "$FABRICMON_BASE_EXPECT_SHA256" ]; then
  echo "build-base: $out already is the pinned base"; exit 0
fi
echo "build-base: mmdebstrap $DEBIAN_SUITE (+$BASE_PACKAGES) from $mirror"
SOURCE_DATE_EPOCH=$SOURCE_DATE_EPOCH mmdebstrap --quiet --variant=minbase --include="$BASE_PACKAGES" --format=tar \
  "$DEBIAN_SUITE" "$out.tmp" "$mirror"
got=$(sha256sum < "$out.tmp" | cut -d' ' -f1)
if [ -n "$FABRICMON_BASE_EXPECT_SHA256" ] && [ "$got" != "$FABRICMON_BASE_EXPECT_SHA256" ]; then
  rm -f -- "$out.tmp"
  echo "build-base: the root filesystem's sha256 is $got, not the pinned $FABRICMON_BASE_EXPECT_SHA256" \
       "(deploy/image/base.env): the archive moved since $DEBIAN_SNAPSHOT; re-pin with scripts/pin-base-image.sh" >&2
  exit 1
fi
mv -f -- "$out.tmp" "$out"
echo "build-base: $out sha256 $got"
