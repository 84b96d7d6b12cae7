"""tests/ stays grouped like the package: no test file at the top, none importing another test file.

Shared code lives in tests/support (imported as ``support.*``, pythonpath in pyproject.toml).
Test modules import by basename (pytest's default import mode, no ``__init__.py``), so two test
files with one name in two folders would shadow each other: names stay unique.
"""

from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path

from support.paths import TESTS

GROUPS = {"sources", "agent", "aggregator", "proto", "sim", "deploy", "realformat", "core"}


def _test_files() -> list[Path]:
    return sorted(p for p in TESTS.rglob("test_*.py") if "fixtures" not in p.relative_to(TESTS).parts)


def _imported_modules(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def _imports_a_test_file(module: str) -> bool:
    parts = module.split(".")
    return parts[0] == "tests" or any(part.startswith("test_") for part in parts)


def test_the_layout_gate_sees_the_tests():
    files = _test_files()
    assert len(files) > 100, files  # a broken glob would pass every check below vacuously
    assert Path(__file__).resolve() in files


def test_no_test_file_sits_directly_in_tests():
    assert [p.name for p in TESTS.glob("test_*.py")] == []


def test_every_test_file_is_in_a_group_folder():
    misplaced = [str(p.relative_to(TESTS)) for p in _test_files()
                 if len(p.relative_to(TESTS).parts) != 2 or p.parent.name not in GROUPS]
    assert misplaced == [], f"put these in one of {sorted(GROUPS)}: {misplaced}"


def test_no_test_file_imports_another_test_file():
    bad = {str(p.relative_to(TESTS)): sorted(m for m in _imported_modules(p) if _imports_a_test_file(m))
           for p in [*_test_files(), *TESTS.joinpath("support").rglob("*.py"), TESTS / "conftest.py"]}
    assert {k: v for k, v in bad.items() if v} == {}, "move what they share into tests/support"


def test_test_file_names_are_unique_across_folders():
    twice = [name for name, n in Counter(p.name for p in _test_files()).items() if n > 1]
    assert twice == []


def test_the_import_check_recognises_a_test_import():
    assert _imports_a_test_file("test_engine") and _imports_a_test_file("tests.aggregator.test_engine")
    assert not _imports_a_test_file("support.enginerig") and not _imports_a_test_file("fabricmon.testing")
