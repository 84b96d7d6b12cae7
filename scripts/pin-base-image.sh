#!/usr/bin/env bash
# Release step: resolve the Containerfile's base image tag to its digest and write it back, so the
# release's image is built from exactly that base (a tag can be re-pushed; a digest cannot).
#
#   scripts/pin-base-image.sh          # ARG PYTHON_IMAGE=...:3.11.13-slim-bookworm -> ...@sha256:...
#   scripts/pin-base-image.sh --check  # exit 1 unless the Containerfile names a digest
#
# Needs skopeo (apt-get install skopeo) or docker with buildx, and the registry reachable.
set -euo pipefail
cd "$(dirname "$0")/.."
line=$(grep -m1 '^ARG PYTHON_IMAGE=' Containerfile) || { echo "Containerfile: no ARG PYTHON_IMAGE" >&2; exit 2; }
ref=${line#ARG PYTHON_IMAGE=}
if [ "${1:-}" = --check ]; then
  case "$ref" in *@sha256:*) echo "pinned: $ref"; exit 0 ;; *) echo "not pinned by digest: $ref" >&2; exit 1 ;; esac
fi
tag_ref=${ref%@*}
if command -v skopeo >/dev/null; then
  digest=$(skopeo inspect --format '{{.Digest}}' "docker://$tag_ref")
elif command -v docker >/dev/null; then
  digest=$(docker buildx imagetools inspect --format '{{json .Manifest.Digest}}' "$tag_ref" | tr -d '"')
else
  echo "needs skopeo or docker buildx to resolve $tag_ref" >&2; exit 2
fi
case "$digest" in sha256:*) ;; *) echo "could not resolve $tag_ref (got '$digest')" >&2; exit 2 ;; esac
sed -i "s|^ARG PYTHON_IMAGE=.*|ARG PYTHON_IMAGE=$tag_ref@$digest|" Containerfile
echo "Containerfile: PYTHON_IMAGE=$tag_ref@$digest"
