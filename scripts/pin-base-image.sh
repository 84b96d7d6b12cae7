#!/usr/bin/env bash
# Release step: pin the image's base to the Debian archive as it is now, and write the pin to
# deploy/image/base.env: the snapshot timestamp (the bookworm Release file's Date, also the build's
# SOURCE_DATE_EPOCH) and the sha256 of the root filesystem mmdebstrap makes from it.
#
#   scripts/pin-base-image.sh          # rebuild the base from today's archive, write the new pin
#   scripts/pin-base-image.sh --check  # exit 1 unless base.env names a snapshot and a sha256
#
# Needs mmdebstrap and Debian's archive (as root).  Commit deploy/image/base.env.
set -euo pipefail
cd "$(dirname "$0")/.."
pin=deploy/image/base.env
if [ "${1:-}" = --check ]; then
  # shellcheck source=/dev/null
  . "$pin"
  [[ "${DEBIAN_SNAPSHOT:-}" =~ ^[0-9]{8}T[0-9]{6}Z$ ]] && [[ "${BASE_ROOTFS_SHA256:-}" =~ ^[0-9a-f]{64}$ ]] \
    || { echo "$pin: not pinned (DEBIAN_SNAPSHOT, BASE_ROOTFS_SHA256)" >&2; exit 1; }
  echo "pinned: debian $DEBIAN_SUITE snapshot $DEBIAN_SNAPSHOT rootfs sha256:$BASE_ROOTFS_SHA256"
  exit 0
fi
# shellcheck source=/dev/null
. "$pin"
date=$(curl -fsS -m 30 "http://deb.debian.org/debian/dists/$DEBIAN_SUITE/Release" | sed -n 's/^Date: //p')
[ -n "$date" ] || { echo "pin-base-image: cannot read $DEBIAN_SUITE's Release date from deb.debian.org" >&2; exit 2; }
epoch=$(date -u -d "$date" +%s)
snap=$(date -u -d "@$epoch" +%Y%m%dT%H%M%SZ)
sed -i -e "s/^DEBIAN_SNAPSHOT=.*/DEBIAN_SNAPSHOT=$snap/" -e "s/^SOURCE_DATE_EPOCH=.*/SOURCE_DATE_EPOCH=$epoch/" "$pin"
out=build/image/rootfs.tar
rm -f -- "$out"
FABRICMON_DEBIAN_MIRROR=http://deb.debian.org/debian FABRICMON_BASE_EXPECT_SHA256="" bash scripts/build-base.sh "$out"
sha=$(sha256sum < "$out" | cut -d' ' -f1)
sed -i "s/^BASE_ROOTFS_SHA256=.*/BASE_ROOTFS_SHA256=$sha/" "$pin"
echo "$pin: debian $DEBIAN_SUITE snapshot $snap rootfs sha256:$sha"
