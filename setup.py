"""Writes the source revision into the build (fabricmon/_revision.py), for fabricmon_build_info.

Everything else is in pyproject.toml.  The revision is, first found: $FABRICMON_REVISION (the
Containerfile passes it: its build context has no .git), `git rev-parse HEAD` in a checkout
(with "-dirty" when tracked files changed), the REVISION file an sdist carries (written here when
the sdist is made: an sdist has no .git), else "unknown".
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.sdist import sdist

HERE = Path(__file__).resolve().parent


def revision() -> str:
    env = os.environ.get("FABRICMON_REVISION", "").strip()
    if env:
        return env
    if (HERE / ".git").exists():
        try:
            head = subprocess.run(["git", "-C", str(HERE), "rev-parse", "HEAD"], capture_output=True,
                                  text=True, timeout=30, check=True).stdout.strip()
            dirty = subprocess.run(["git", "-C", str(HERE), "diff", "--quiet", "HEAD", "--"],
                                   capture_output=True, timeout=30).returncode != 0
            return head + ("-dirty" if dirty else "")
        except (OSError, subprocess.SubprocessError):
            pass
    stored = HERE / "REVISION"
    if stored.is_file():
        return stored.read_text().strip() or "unknown"
    return "unknown"


def _module(rev: str) -> str:
    return f'"""Written at build time by setup.py."""\n\nREVISION = {rev!r}\n'


class BuildPy(build_py):
    def run(self) -> None:
        super().run()
        target = Path(self.build_lib) / "fabricmon" / "_revision.py"
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(_module(revision()))


class Sdist(sdist):
    def make_release_tree(self, base_dir: str, files: list[str]) -> None:
        super().make_release_tree(base_dir, files)
        path = Path(base_dir) / "REVISION"
        if path.exists():
            path.unlink()  # a hard link to the checkout's file: never write through it
        path.write_text(revision() + "\n")


setup(cmdclass={"build_py": BuildPy, "sdist": Sdist})
