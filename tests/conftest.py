"""Shared pytest fixtures.

``make_fixture`` writes fixture nodes with the repository's own writer,
``fabricmon.sim.fixture`` (in-process; nothing outside the repository).
"""

from __future__ import annotations

import itertools
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import structlog

from fabricmon.sim import fixture as fixture_writer


class FixtureMaker:
    """Generates fixture trees, cached per argument set for the whole session.

    ``make_fixture(layout="roce", fault="counter_reset", snapshots=3)`` returns
    the tree's ROOT (``ROOT/t0..`` when ``snapshots > 1``).  Keyword options map
    to ``python -m fabricmon.sim.fixture``'s flags (``fault_dev="mlx5_3"`` -> ``--fault-dev mlx5_3``,
    ``legacy_ext=True`` -> ``--legacy-ext``).  Cached trees are shared: a test
    that modifies its tree must ask for ``fresh=True`` (a private, uncached
    copy).  ``prefetch`` generates many trees in parallel, since one 9-NIC
    tree takes about 0.3 s.
    """

    # The writer as a script, for tests of its command line (``python <tool> --help``).
    tool = Path(fixture_writer.__file__)

    def __init__(self, base: Path) -> None:
        self._base = base
        self._cache: dict[tuple, Path] = {}
        self._n = itertools.count()

    @staticmethod
    def _key(options: Mapping[str, Any]) -> tuple:
        return tuple(sorted((k, str(v)) for k, v in options.items()))

    def _generate(self, options: Mapping[str, Any]) -> Path:
        root = self._base / f"tree{next(self._n)}"
        fixture_writer.write_fixture(root, **options)
        return root

    def __call__(self, *, fresh: bool = False, **options: Any) -> Path:
        options.setdefault("layout", "ib")
        options.setdefault("fault", "none")
        if fresh:
            return self._generate(options)
        key = self._key(options)
        if key not in self._cache:
            self._cache[key] = self._generate(options)
        return self._cache[key]

    def prefetch(self, option_sets: Iterable[Mapping[str, Any]], workers: int = 4) -> None:
        """Generate (and cache) many trees concurrently; writing a tree is mostly file-system calls."""
        todo = []
        for options in option_sets:
            options = {"layout": "ib", "fault": "none", **options}
            if self._key(options) not in self._cache:
                todo.append(options)
        if not todo:
            return
        with ThreadPoolExecutor(max_workers=workers) as pool:
            for options, root in zip(todo, pool.map(self._generate, todo), strict=True):
                self._cache[self._key(options)] = root


@pytest.fixture(scope="session")
def make_fixture(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FixtureMaker]:
    # The writer writes every file atomically (temp file + rename): on a loaded
    # ext4 /tmp a 3-snapshot tree took 4 s against 0.4 s on tmpfs, and real
    # sysfs is in memory too.  Fall back to pytest's tmp dir without /dev/shm.
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK):
        base = Path(tempfile.mkdtemp(prefix="fabricmon-fixtures-", dir=shm))
        try:
            yield FixtureMaker(base)
        finally:
            shutil.rmtree(base, ignore_errors=True)
    else:
        yield FixtureMaker(tmp_path_factory.mktemp("sysfs-fixtures"))


@pytest.fixture
def tree_dir(tmp_path: Path) -> Iterator[Path]:
    """Where a test's simulator renders node trees (``demo --workdir``): tmpfs when the machine has a
    writable /dev/shm (as ``make_fixture``: every file is written with a rename, which took 1.3 ms
    each on this machine's loaded ext4 /tmp, two thirds of a tree-mode demo test), else tmp_path."""
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK):
        base = Path(tempfile.mkdtemp(prefix="fabricmon-trees-", dir=shm))
        try:
            yield base
        finally:
            shutil.rmtree(base, ignore_errors=True)
    else:
        yield tmp_path / "trees"


@pytest.fixture(scope="session", autouse=True)
def _structlog_pristine() -> dict[str, Any]:
    """structlog's configuration before any test or fixture ran (a session fixture is set up first)."""
    return structlog.get_config()


@pytest.fixture(autouse=True)
def _structlog_config_restored(_structlog_pristine: dict[str, Any]) -> Iterator[None]:
    """A test or a module fixture that runs a command in process (``fabricmon.cli.main``) configures
    structlog for the whole process, its level filter included (``--log-level error`` drops warnings for
    good).  Every test starts and ends with the configuration the session started with, so a
    log-capturing test never depends on which test or fixture ran before it."""
    structlog.configure(**_structlog_pristine)
    yield
    structlog.configure(**_structlog_pristine)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under pytest-xdist (scripts/test.sh: ``-n auto --dist loadgroup``) a test file's tests run on one
    worker, so a module fixture (a Prometheus, an Alertmanager, a built wheel) starts once; tests that
    share something outside pytest's temporary folders (``xdist_group`` on them, e.g. the builds that
    write into the checkout) run on one worker whatever their file."""
    if not config.pluginmanager.hasplugin("xdist"):
        return
    for item in items:
        if item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::", 1)[0]))
