#!/usr/bin/env bash
# Build the fabricmon image with buildah (Debian's package: apt-get install buildah mmdebstrap; as root):
#
#   scripts/build-image.sh [TAG]    # TAG defaults to ghcr.io/gpu-fabricmon/gpu-fabricmon:<version>
#
# 1. the pinned base root filesystem (scripts/build-base.sh: mmdebstrap, deploy/image/base.env);
# 2. the wheelhouse build/image/wheels: every wheel requirements/build.lock and the role's lock pin, for the
#    base's CPython and glibc (BASE_PYTHON, BASE_GLIBC), fetched and hash-checked by pip here, on the host
#    (its cache serves what CI's own install fetched), so the container build reaches no network;
# 3. buildah bud on the Containerfile, its RUN steps installing from the wheelhouse with --no-index.
#
# Environment: FABRICMON_IMAGE_EXTRAS (default aggregator; empty for an agent-only image),
# FABRICMON_BUILD_PYTHON (the python whose pip fills the wheelhouse: .venv/bin/python, else python3),
# FABRICMON_CONTAINERS_OPTS (global buildah options, e.g. "--root DIR --runroot DIR --storage-driver
# overlay"; default: the host's containers storage.conf).  RUN steps use chroot isolation, which works
# where the host is itself a container (tests/deploy/test_image.py, deploy/README.md).
set -euo pipefail
cd "$(dirname "$0")/.."
command -v buildah >/dev/null || { echo "build-image: needs buildah (apt-get install buildah)" >&2; exit 2; }
# One build at a time in a checkout: the base and the wheelhouse are files under build/image.
mkdir -p build/image
exec 9>build/image/.lock
flock 9
version=$(sed -n 's/^__version__ = "\(.*\)"$/\1/p' fabricmon/__init__.py)
tag=${1:-ghcr.io/gpu-fabricmon/gpu-fabricmon:$version}
revision=$(git rev-parse HEAD 2>/dev/null || echo unknown)
extras=${FABRICMON_IMAGE_EXTRAS-aggregator}
py=${FABRICMON_BUILD_PYTHON:-}
if [ -z "$py" ]; then if [ -x .venv/bin/python ]; then py=.venv/bin/python; else py=python3; fi; fi
# shellcheck source=/dev/null
. deploy/image/base.env
# shellcheck disable=SC2206  # options, split as words on purpose
opts=(${FABRICMON_CONTAINERS_OPTS:-})

t0=$SECONDS
bash scripts/build-base.sh build/image/rootfs.tar
t1=$SECONDS
# The base's interpreter and every manylinux level its glibc runs (pip does not widen --platform itself).
platforms=()
for minor in $(seq "${BASE_GLIBC#2.}" -1 17); do platforms+=(--platform "manylinux_2_${minor}_x86_64"); done
platforms+=(--platform manylinux2014_x86_64)
rm -rf build/image/wheels
for lock in build "${extras:-agent}"; do
  "$py" -m pip download --quiet --disable-pip-version-check --no-deps --require-hashes --only-binary=:all: \
    --python-version "$BASE_PYTHON" --implementation cp --abi "cp${BASE_PYTHON/./}" "${platforms[@]}" \
    -d build/image/wheels -r "requirements/$lock.lock"
done
t2=$SECONDS
buildah "${opts[@]}" bud --isolation chroot --layers=false \
  --build-arg REVISION="$revision" --build-arg VERSION="$version" --build-arg EXTRAS="$extras" -t "$tag" -f Containerfile .
echo "build-image: $tag (base $((t1 - t0)) s, wheelhouse $((t2 - t1)) s, buildah $((SECONDS - t2)) s)"
