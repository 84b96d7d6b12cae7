#!/usr/bin/env bash
# ruff and mypy, as CI runs them (scripts/test.sh, before the tests) and as the pre-commit hooks do.
# What they check and how is all in pyproject.toml ([tool.ruff], [tool.mypy]); their versions are
# pinned in the test extra (requirements/test.lock).
#
#   bash scripts/lint.sh        # exit 1 on any finding
set -uo pipefail
cd "$(dirname "$0")/.."
BIN=${FABRICMON_LINT_BIN:-.venv/bin}
rc=0
"$BIN/ruff" check . || rc=1
"$BIN/mypy" || rc=1
exit "$rc"
