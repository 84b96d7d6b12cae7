"""Shared pytest fixtures.

``make_fixture`` runs the shared sysfs fixture generator, which lives beside
the repository in ``../shared/tools/make-sysfs-fixture``.
"""

from __future__ import annotations

import itertools
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

FIXTURE_TOOL = Path(__file__).resolve().parents[1] / ".." / "shared" / "tools" / "make-sysfs-fixture"


class FixtureMaker:
    """Generates fixture trees, cached per argument set for the whole session.

    ``make_fixture(layout="roce", fault="counter_reset", snapshots=3)`` returns
    the tree's ROOT (``ROOT/t0..`` when ``snapshots > 1``).  Keyword options map
    to the tool's flags (``fault_dev="mlx5_3"`` -> ``--fault-dev mlx5_3``,
    ``legacy_ext=True`` -> ``--legacy-ext``).  Cached trees are shared: a test
    that modifies its tree must ask for ``fresh=True`` (a private, uncached
    copy).  ``prefetch`` generates many trees in parallel, since one 9-NIC
    tree takes about 0.3 s.
    """

    tool = FIXTURE_TOOL

    def __init__(self, base: Path) -> None:
        self._base = base
        self._cache: dict[tuple, Path] = {}
        self._n = itertools.count()

    @staticmethod
    def _key(options: Mapping[str, Any]) -> tuple:
        return tuple(sorted((k, str(v)) for k, v in options.items()))

    def _args(self, root: Path, options: Mapping[str, Any]) -> list[str]:
        args = [sys.executable, str(self.tool), "--root", str(root)]
        for k, v in sorted(options.items()):
            flag = "--" + k.replace("_", "-")
            if v is True:
                args.append(flag)
            elif v is not False and v is not None:
                args += [flag, str(v)]
        return args

    def _generate(self, options: Mapping[str, Any]) -> Path:
        root = self._base / f"tree{next(self._n)}"
        proc = subprocess.run(self._args(root, options), capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"make-sysfs-fixture {dict(options)} exited {proc.returncode}: {proc.stderr[-800:]}")
        return root

    def __call__(self, *, fresh: bool = False, **options: Any) -> Path:
        if not self.tool.exists():
            pytest.skip(f"fixture tool not found at {self.tool} (expected ../shared beside the repository)")
        options.setdefault("layout", "ib")
        options.setdefault("fault", "none")
        if fresh:
            return self._generate(options)
        key = self._key(options)
        if key not in self._cache:
            self._cache[key] = self._generate(options)
        return self._cache[key]

    def prefetch(self, option_sets: Iterable[Mapping[str, Any]], workers: int = 4) -> None:
        """Generate (and cache) many trees concurrently; the tool is I/O- and startup-bound."""
        todo = []
        for options in option_sets:
            options = {"layout": "ib", "fault": "none", **options}
            if self._key(options) not in self._cache:
                todo.append(options)
        if not todo or not self.tool.exists():
            return
        with ThreadPoolExecutor(max_workers=workers) as pool:
            for options, root in zip(todo, pool.map(self._generate, todo)):
                self._cache[self._key(options)] = root


@pytest.fixture(scope="session")
def make_fixture(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FixtureMaker]:
    # The tool writes every file atomically (temp file + rename): on a loaded
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
