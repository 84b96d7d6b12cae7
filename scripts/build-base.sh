#!/usr/bin/env bash
# Make the image's base root filesystem from Debian's archive with mmdebstrap, as pinned in
# deploy/image/base.env, and check its sha256 (apt-get install mmdebstrap; as root).
#
#   scripts/build-base.sh [OUT]     # OUT defaults to build/image/rootfs.tar (what the Containerfile ADDs)
#
# The mirror is snapshot.debian.org at DEBIAN_SNAPSHOT where it is reachable, else deb.debian.org, whose
# bookworm gives the same bytes until its next update (then the sha256 differs: the build stops and
# scripts/pin-base-image.sh re-pins).  FABRICMON_DEBIAN_MIRROR overrides the mirror.
# A pinned base once made is kept in FABRICMON_IMAGE_CACHE (default ~/.cache/fabricmon, named by its
# sha256; empty: no cache), so another checkout or a clean clone on the same machine takes it from there.
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
cache=${FABRICMON_IMAGE_CACHE-${XDG_CACHE_HOME:-$HOME/.cache}/fabricmon}
cached=""
[ -z "$cache" ] || [ -z "$FABRICMON_BASE_EXPECT_SHA256" ] || cached="$cache/base-$FABRICMON_BASE_EXPECT_SHA256.tar"
haves=("$out")
[ -z "$cached" ] || haves+=("$cached")
for have in "${haves[@]}"; do
  if [ -f "$have" ] && [ -n "$FABRICMON_BASE_EXPECT_SHA256" ] \
     && [ "$(sha256sum < "$have" | cut -d' ' -f1)" = "$FABRICMON_BASE_EXPECT_SHA256" ]; then
    [ "$have" = "$out" ] || cp -f -- "$have" "$out"
    echo "build-base: $out is the pinned base (from $have)"; exit 0
  fi
done
echo "build-base: mmdebstrap $DEBIAN_SUITE $BASE_VARIANT (+$BASE_PACKAGES) from $mirror"
# A runtime image's root filesystem: no manual pages, documentation (the copyright files stay) or
# translations; dpkg without fsync while it is made (force-unsafe-io: an interrupted build is thrown
# away anyway), a setting removed before the tarball is written.
SOURCE_DATE_EPOCH=$SOURCE_DATE_EPOCH mmdebstrap --quiet --variant="$BASE_VARIANT" --include="$BASE_PACKAGES" \
  --dpkgopt=force-unsafe-io --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/info/*' \
  --dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-exclude=/usr/share/doc/*' \
  --dpkgopt='path-include=/usr/share/doc/*/copyright' \
  --customize-hook='rm "$1/etc/dpkg/dpkg.cfg.d/99mmdebstrap"' \
  --format=tar "$DEBIAN_SUITE" "$out.tmp" "$mirror"
got=$(sha256sum < "$out.tmp" | cut -d' ' -f1)
if [ -n "$FABRICMON_BASE_EXPECT_SHA256" ] && [ "$got" != "$FABRICMON_BASE_EXPECT_SHA256" ]; then
  rm -f -- "$out.tmp"
  echo "build-base: the root filesystem's sha256 is $got, not the pinned $FABRICMON_BASE_EXPECT_SHA256" \
       "(deploy/image/base.env): the archive moved since $DEBIAN_SNAPSHOT; re-pin with scripts/pin-base-image.sh" >&2
  exit 1
fi
mv -f -- "$out.tmp" "$out"
if [ -n "$cached" ]; then mkdir -p "$cache" && cp -f -- "$out" "$cached.tmp" && mv -f -- "$cached.tmp" "$cached"; fi
echo "build-base: $out sha256 $got"
