#!/usr/bin/env bash
# Regenerate the hash-pinned dependency locks from pyproject.toml (pip-tools: pip install pip-tools).
#
#   scripts/lock.sh            # rewrite requirements/*.lock
#
# requirements/agent.lock       fabricmon's dependencies (agent nodes)
# requirements/aggregator.lock  + the aggregator extra (the image, the aggregator host)
# requirements/test.lock        + the test extra (CI: scripts/test.sh)
# requirements/build.lock       build + setuptools, from requirements/build.in (the Containerfile's build stage)
# Each is installed with `pip install --require-hashes -r LOCK`, then fabricmon itself with
# --no-deps (Containerfile, scripts/install.sh, scripts/test.sh); tests/deploy/test_release.py checks that
# every lock covers pyproject.toml's requirements.  Resolve for the image's Python (3.11).
set -euo pipefail
cd "$(dirname "$0")/.."
COMPILER=${FABRICMON_PIP_COMPILE:-pip-compile}
compile() {
  local out=$1; shift
  CUSTOM_COMPILE_COMMAND="scripts/lock.sh" "$COMPILER" --quiet --generate-hashes --strip-extras --allow-unsafe \
    --no-emit-index-url --no-emit-find-links --resolver=backtracking -o "$out" "$@"
}
compile requirements/agent.lock pyproject.toml
compile requirements/aggregator.lock --extra aggregator pyproject.toml
compile requirements/test.lock --extra test pyproject.toml
compile requirements/build.lock requirements/build.in
# The test extra names fabricmon[aggregator]: pip-compile lists the project itself (a local path,
# unhashable).  fabricmon is installed from the checkout with --no-deps after the lock: drop it.
awk '/^# WARNING: pip install will require the following package to be hashed/ {skip=1}
     skip && /^fabricmon @ / {getline; skip=0; next}
     !skip' requirements/test.lock > requirements/test.lock.tmp
mv requirements/test.lock.tmp requirements/test.lock
! grep -n "^fabricmon @\|file://" requirements/*.lock
