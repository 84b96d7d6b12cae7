#!/usr/bin/env bash
# The smoke set on a supported Python other than the suite's (default 3.10: DGX OS 6's and Ubuntu
# 22.04's python3): install, the parsers' and codec's tests, agent --once on a fixture node (its
# exposition the same as the default venv's), aggregator check-config, a short demo to its report.
#
#   scripts/smoke-python.sh [3.10]     # scripts/test.sh runs it; FABRICMON_PYTHON310=PATH names the interpreter
#
# The interpreter is found as CI finds it (no fixed path): $FABRICMON_PYTHON<XY>, else python3.X on
# PATH when it runs (pyenv's shim runs only when that version is selected), else pyenv's own
# versions/3.X.*.  None found fails: a supported Python nobody tests is not supported.
set -euo pipefail
cd "$(dirname "$0")/.."
ver=${1:-3.10}
var="FABRICMON_PYTHON${ver//./}"
py=${!var:-}
if [ -z "$py" ]; then
  if command -v "python$ver" >/dev/null && "python$ver" -c '' 2>/dev/null; then py=$(command -v "python$ver")
  elif command -v pyenv >/dev/null; then py=$(ls -d "$(pyenv root)/versions/$ver".*/bin/python 2>/dev/null | tail -1 || true)
  fi
fi
[ -n "$py" ] && "$py" -c '' 2>/dev/null || {
  echo "smoke: no python$ver here (set $var=PATH, or pyenv install $ver): the $ver smoke set cannot run" >&2; exit 1; }
got=$("$py" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
[ "$got" = "$ver" ] || { echo "smoke: $py is Python $got, not $ver" >&2; exit 1; }

venv=.venv-py$ver
lockdir=requirements
[ ! -d "requirements/py$ver" ] || lockdir="requirements/py$ver"
lock=$lockdir/smoke.lock
[ -f "$lock" ] || lock=$lockdir/test.lock
t0=$SECONDS
[ -x "$venv/bin/python" ] || "$py" -m venv "$venv"
pip=("$venv/bin/python" -m pip --disable-pip-version-check -q)
"${pip[@]}" install --require-hashes -r "$lock"
# A real install of the checkout (not editable), as on a node: its console script runs the installed copy.
"${pip[@]}" install --no-deps --no-build-isolation --force-reinstall .
echo "smoke $ver: installed $("$venv/bin/fabricmon" --version) in $((SECONDS - t0)) s"

work=$(mktemp -d)
trap 'rm -rf -- "$work"' EXIT
# The parsers' and the codec's tests (the ones that start no process).
"$venv/bin/python" -m pytest -q -p no:cacheprovider -m "not integration and not soak" \
  tests/proto tests/realformat tests/sources/test_infiniband.py tests/sources/test_ethtool.py

# agent --once on a fixture node: the exposition equals the default venv's but for the times and the
# python_version label.
"$venv/bin/python" -m fabricmon.sim.fixture --root "$work/fx" >/dev/null
once() {
  "$1" --log-level error agent --once --sysfs-root "$work/fx/sys" --ethtool-dir "$work/fx/ethtool" \
    --nvml "fake:$work/fx/nvml.json" --node-name node-007 \
    | grep -v -e '^fabricmon_collector_duration_seconds{' -e '^fabricmon_snapshot_timestamp_seconds{' | sed 's/python_version="[^"]*"/python_version=""/'
}
once "$venv/bin/fabricmon" > "$work/once.prom"
ports=$(grep -c '^fabricmon_ib_port_state{.* 4.0$' "$work/once.prom" || true)
[ "$ports" -eq 9 ] || { echo "smoke $ver: agent --once exported $ports active IB ports, not 9" >&2; exit 1; }
if [ -x .venv/bin/fabricmon ]; then
  once .venv/bin/fabricmon > "$work/once-default.prom"
  diff -u "$work/once-default.prom" "$work/once.prom" >&2 \
    || { echo "smoke $ver: agent --once differs from the default venv's (above)" >&2; exit 1; }
fi
echo "smoke $ver: agent --once exported the fixture node ($(wc -l < "$work/once.prom") lines)"

# aggregator check-config on the shipped example (its topology beside it; the token is the unit's credential).
sed "s#/etc/fabricmon/#$PWD/systemd/etc/fabricmon/#g" systemd/etc/fabricmon/aggregator.yaml > "$work/aggregator.yaml"
"$venv/bin/fabricmon" check-config --skip-secrets --kind aggregator "$work/aggregator.yaml" 2>/dev/null

# A short demo (in memory, no Alertmanager): it must end with its report.
"$venv/bin/fabricmon" --log-level error demo --nodes 8 --duration 40 --speed 40 --mode memory --no-alertmanager \
  --report-json "$work/report.json" > "$work/demo.out"
tail -n 3 "$work/demo.out"
"$venv/bin/python" -c 'import json, sys; r = json.load(open(sys.argv[1])); assert r["faults"], r' "$work/report.json"
echo "smoke $ver: ok in $((SECONDS - t0)) s"
