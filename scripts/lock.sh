#!/usr/bin/env bash
# Regenerate the hash-pinned dependency locks from pyproject.toml (pip-tools: pip install pip-tools).
#
#   scripts/lock.sh            # rewrite requirements/*.lock and requirements/py3.10/*.lock
#
# requirements/agent.lock       fabricmon's dependencies (agent nodes)
# requirements/aggregator.lock  + the aggregator extra (the image, the aggregator host)
# requirements/test.lock        + the test extra (CI: scripts/test.sh)
# requirements/build.lock       build + setuptools, from requirements/build.in (the Containerfile's build stage)
# Each is installed with `pip install --require-hashes -r LOCK`, then fabricmon itself with
# --no-deps (Containerfile, scripts/install.sh, scripts/test.sh); tests/deploy/test_release.py checks that
# every lock covers pyproject.toml's requirements.
#
# Per Python: pip-compile resolves for the interpreter it runs on.  The top-level locks are resolved on
# the Debian default (3.11, the image's Python) and also hold for 3.12 and 3.13 (every pin has wheels for
# them: tests/deploy/test_python_versions.py).  Python 3.10 (DGX OS 6, Ubuntu 22.04) differs (numpy 2.3+
# and some test tools need 3.11; pytest and build need tomli and exceptiongroup there), so its locks are
# resolved on a python3.10 into requirements/py3.10/; scripts/install.sh and scripts/test.sh pick
# requirements/py3.<minor>/ when it exists for the interpreter they install with.
# The python3.10 is $FABRICMON_PYTHON310, else python3.10 on PATH (pyenv's shim), else pyenv's 3.10.
set -euo pipefail
cd "$(dirname "$0")/.."
COMPILER=${FABRICMON_PIP_COMPILE:-pip-compile}
compile() {
  local compiler=$1 out=$2; shift 2
  CUSTOM_COMPILE_COMMAND="scripts/lock.sh" "$compiler" --quiet --generate-hashes --strip-extras --allow-unsafe \
    --no-emit-index-url --no-emit-find-links --resolver=backtracking -o "$out" "$@"
}
# The test extra names fabricmon[aggregator]: pip-compile lists the project itself (a local path,
# unhashable).  fabricmon is installed from the checkout with --no-deps after the lock: drop it.
drop_self() {
  awk '/^# WARNING: pip install will require the following package to be hashed/ {skip=1}
       skip && /^fabricmon @ / {getline; skip=0; next}
       !skip' "$1" > "$1.tmp"
  mv "$1.tmp" "$1"
}
# locks DIR COMPILER: the three project locks into DIR.
locks() {
  local dir=$1 compiler=$2
  compile "$compiler" "$dir/agent.lock" pyproject.toml
  compile "$compiler" "$dir/aggregator.lock" --extra aggregator pyproject.toml
  [ -f "$dir/test.lock" ] || cp "$dir/aggregator.lock" "$dir/test.lock"
  compile "$compiler" "$dir/test.lock" --extra test pyproject.toml
  drop_self "$dir/test.lock"
}
locks requirements "$COMPILER"
compile "$COMPILER" requirements/build.lock requirements/build.in

py310=${FABRICMON_PYTHON310:-}
if [ -z "$py310" ]; then
  if command -v python3.10 >/dev/null && python3.10 -c '' 2>/dev/null; then py310=$(command -v python3.10)
  elif command -v pyenv >/dev/null; then py310=$(ls -d "$(pyenv root)"/versions/3.10*/bin/python 2>/dev/null | tail -1)
  fi
fi
[ -n "$py310" ] || { echo "lock.sh: no python3.10 (set FABRICMON_PYTHON310): requirements/py3.10 not written" >&2; exit 2; }
tools=$(mktemp -d)
trap 'rm -rf -- "$tools"' EXIT
"$py310" -m venv "$tools/venv"
"$tools/venv/bin/pip" install -q pip-tools
mkdir -p requirements/py3.10
# Start from the default locks so pip-compile keeps their pins wherever 3.10 allows them (an existing
# output is its preference).  Not the test lock: a pin seeded from there is kept even when its marker
# leaves it out on 3.10 (grafana-foundation-sdk); it starts from the 3.10 aggregator lock instead.
for f in agent aggregator; do [ -f "requirements/py3.10/$f.lock" ] || cp "requirements/$f.lock" "requirements/py3.10/$f.lock"; done
compile "$tools/venv/bin/pip-compile" requirements/py3.10/agent.lock pyproject.toml
compile "$tools/venv/bin/pip-compile" requirements/py3.10/aggregator.lock --extra aggregator pyproject.toml
# pip-compile drops the markers of an extra's requirements read from pyproject.toml (it then demands
# grafana-foundation-sdk, marked python_version >= '3.11', on 3.10): the test lock is compiled from the
# same requirements written out as a requirements file, where it honours them.
# smoke.lock: the smoke set's (scripts/smoke-python.sh) share of the test extra, the runtime's pins and
# pytest, hypothesis, pytest-timeout and setuptools (it builds the checkout, --no-build-isolation): the whole
# test lock took 87 s to install here.
reqs() {  # the requirements of pyproject's dependencies, aggregator extra and test extra (those named in $1)
  python3 - "$1" <<'PY'
import sys, tomllib
from packaging.requirements import Requirement
p = tomllib.load(open("pyproject.toml", "rb"))["project"]
extras = p["optional-dependencies"]
only = set(sys.argv[1].split()) if sys.argv[1] else None
print("\n".join(p["dependencies"] + extras["aggregator"]))
for r in extras["test"]:
    if not r.startswith("fabricmon[") and (only is None or Requirement(r).name in only):
        print(r)
PY
}
reqs "" > "$tools/test.in"
reqs "pytest hypothesis pytest-timeout setuptools" > "$tools/smoke.in"
for f in test smoke; do
  [ -f "requirements/py3.10/$f.lock" ] || cp requirements/py3.10/aggregator.lock "requirements/py3.10/$f.lock"
  compile "$tools/venv/bin/pip-compile" "requirements/py3.10/$f.lock" "$tools/$f.in"
  sed -i "s#$tools/$f.in#pyproject.toml#" "requirements/py3.10/$f.lock"
done
! grep -rn "^fabricmon @\|file://" requirements/
