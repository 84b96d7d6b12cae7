"""Other supported Pythons, found as CI finds them (scripts/smoke-python.sh): no fixed path."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path


def _runs(exe: str, version: str) -> bool:
    try:
        res = subprocess.run([exe, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                             capture_output=True, text=True, timeout=30)
    except OSError:
        return False
    return res.returncode == 0 and res.stdout.strip() == version


def find_python(version: str) -> str | None:
    """$FABRICMON_PYTHON<XY>, else pythonX.Y on PATH when it runs (a pyenv shim may not), else pyenv's own."""
    env = os.environ.get(f"FABRICMON_PYTHON{version.replace('.', '')}")
    cands = [env] if env else []
    if exe := shutil.which(f"python{version}"):
        cands.append(exe)
    if pyenv := shutil.which("pyenv"):
        res = subprocess.run([pyenv, "root"], capture_output=True, text=True, timeout=30)
        if res.returncode == 0:
            cands += [str(p) for p in sorted(Path(res.stdout.strip()).glob(f"versions/{version}.*/bin/python"))]
    return next((c for c in cands if _runs(c, version)), None)
