"""Packaging: the wheel and sdist build, install into a clean venv, and the agent runs without numpy.

The Containerfile installs exactly this wheel (deploy/README.md), so a wheel that installs and runs
`fabricmon agent --once` here is what the image's build stage would produce.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import tarfile
import venv
import zipfile
from pathlib import Path

import pytest

from support.promtools import REPO

# builds from the checkout (setuptools writes build/ and fabricmon.egg-info there): one xdist worker for both
pytestmark = pytest.mark.xdist_group("builds-from-checkout")

PKG = REPO / "fabricmon"
# Packages an agent node runs (plus the top-level modules they import): no numpy there.
AGENT_PACKAGES = ("agent", "sources")


def _imports(path: Path) -> set[str]:
    mods: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            mods.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            mods.add(node.module.split(".")[0])
    return mods


def test_agent_and_sources_do_not_import_numpy() -> None:
    files = [f for pkg in AGENT_PACKAGES for f in sorted((PKG / pkg).rglob("*.py"))]
    assert len(files) > 5
    offenders = [str(f.relative_to(REPO)) for f in files if "numpy" in _imports(f)]
    assert not offenders, f"agent code imports numpy (an extra: fabricmon[aggregator]): {offenders}"


def _agent_args(fx: Path) -> list[str]:
    return ["--log-level", "error", "agent", "--once", "--sysfs-root", str(fx / "sys"), "--ethtool-dir",
            str(fx / "ethtool"),
            "--nvml", f"fake:{fx / 'nvml.json'}", "--node-name", "node-007"]


def _check_exposition(out: str) -> None:
    # One IB port state per NIC of the fixture node (8 rail NICs + frontend), all ACTIVE.
    states = [ln for ln in out.splitlines() if ln.startswith("fabricmon_ib_port_state{")]
    assert len(states) == 9, out[-2000:]
    assert all(ln.endswith(" 4.0") for ln in states), states
    assert 'fabricmon_nvlink_up{' in out


# A blocked import: `import numpy` raises ImportError, as on a node without the extra.
BLOCK_NUMPY = "import sys; sys.modules['numpy'] = None; "


@pytest.mark.integration
def test_agent_once_runs_with_numpy_blocked(make_fixture) -> None:
    fx = make_fixture(layout="ib", fault="none", seed=1)
    code = (BLOCK_NUMPY + "from fabricmon.cli import main; rc = main(sys.argv[1:]); "
            "assert 'numpy' not in sys.modules or sys.modules['numpy'] is None; sys.exit(rc)")
    res = subprocess.run([sys.executable, "-c", code, *_agent_args(fx)], capture_output=True, text=True,
                         timeout=120, cwd=REPO)
    assert res.returncode == 0, res.stderr[-2000:]
    _check_exposition(res.stdout)


@pytest.mark.integration
@pytest.mark.parametrize("command", [["aggregator", "--config", "/nonexistent.yaml"], ["demo", "--nodes", "2"]])
def test_numpy_commands_name_the_extra_without_it(command: list[str]) -> None:
    code = BLOCK_NUMPY + "from fabricmon.cli import main; sys.exit(main(sys.argv[1:]))"
    res = subprocess.run([sys.executable, "-c", code, *command], capture_output=True, text=True,
                         timeout=120, cwd=REPO)
    assert res.returncode == 2, (res.returncode, res.stderr[-2000:])
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    assert "fabricmon[aggregator]" in lines[0] and command[0] in lines[0], lines[0]


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    """What is built: a clone of the checkout's HEAD (the committed tree, as CI's clean clone has it).  The
    build writes build/ and fabricmon.egg-info into its source tree and walks it, while tests on the other
    worker run in the checkout (a build there failed once with a file gone under it)."""
    src = tmp_path_factory.mktemp("src") / "fabricmon"
    res = subprocess.run(["git", "clone", "-q", "--shared", str(REPO), str(src)], capture_output=True, text=True,
                         timeout=120)
    return src if res.returncode == 0 else REPO  # not a git checkout (an unpacked sdist): build it in place


@pytest.fixture(scope="module")
def dist(tmp_path_factory, source: Path) -> Path:
    out = tmp_path_factory.mktemp("dist")
    # --no-isolation: build with the setuptools of this venv (the test extra), no index needed.
    res = subprocess.run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(source)],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return out


def test_sdist_and_wheel_contents(dist: Path) -> None:
    (whl,) = dist.glob("fabricmon-*.whl")
    (sdist,) = dist.glob("fabricmon-*.tar.gz")
    names = set(zipfile.ZipFile(whl).namelist())
    assert "fabricmon/py.typed" in names
    assert any(n.endswith(".dist-info/licenses/LICENSE") or n.endswith(".dist-info/LICENSE") for n in names)
    assert any(n.endswith(".proto") for n in names)
    meta = next(zipfile.ZipFile(whl).read(n).decode() for n in names if n.endswith(".dist-info/METADATA"))
    requires = [ln for ln in meta.splitlines() if ln.startswith("Requires-Dist:")]
    base = [r for r in requires if "extra ==" not in r]
    assert not any("numpy" in r for r in base), base
    assert any("numpy" in r and 'extra == "aggregator"' in r for r in requires), requires
    with tarfile.open(sdist) as tar:
        snames = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    assert {"LICENSE", "pyproject.toml", "fabricmon/py.typed", "fabricmon/cli.py"} <= snames


@pytest.mark.integration
def test_wheel_in_a_clean_venv_runs_the_agent_without_numpy(dist: Path, make_fixture, tmp_path: Path) -> None:
    """What the Containerfile's runtime stage does: pip install the wheel (no extra), then run it."""
    (whl,) = dist.glob("fabricmon-*.whl")
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True, clear=True).create(env_dir)
    py = env_dir / "bin" / "python"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    res = subprocess.run([str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check", str(whl)],
                         capture_output=True, text=True, timeout=400, env=env)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    # The wheel did not pull numpy in: agent nodes install no numpy.
    res = subprocess.run([str(py), "-c", "import numpy"], capture_output=True, text=True, env=env, timeout=60)
    assert res.returncode != 0 and "No module named 'numpy'" in res.stderr
    fabricmon = env_dir / "bin" / "fabricmon"
    # Run from tmp_path, so the repository checkout cannot be imported instead of the installed wheel.
    res = subprocess.run([str(fabricmon), "--help"], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=60)
    assert res.returncode == 0 and "agent" in res.stdout, res.stderr
    res = subprocess.run([str(py), "-c", "import fabricmon, sys; print(fabricmon.__file__)"],
                         capture_output=True, text=True, env=env, cwd=tmp_path, timeout=60)
    assert str(env_dir) in res.stdout, res.stdout
    fx = make_fixture(layout="ib", fault="none", seed=1)
    res = subprocess.run([str(fabricmon), *_agent_args(fx)], capture_output=True, text=True, env=env,
                         cwd=tmp_path, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    _check_exposition(res.stdout)
    res = subprocess.run([str(fabricmon), "aggregator", "--config", str(tmp_path / "none.yaml")],
                         capture_output=True, text=True, env=env, cwd=tmp_path, timeout=60)
    assert res.returncode == 2 and "pip install 'fabricmon[aggregator]'" in res.stderr, res.stderr


def test_wheel_from_the_sdist_carries_version_and_revision(dist: Path, source: Path) -> None:
    """`python -m build` makes the wheel from the sdist, which has no .git: the revision reaches
    fabricmon_build_info through the REVISION file setup.py writes into the sdist."""
    from fabricmon import __version__

    head = subprocess.run(["git", "-C", str(source), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=30)
    if head.returncode != 0:
        pytest.skip("not a git checkout: no revision to compare")
    dirty = subprocess.run(["git", "-C", str(source), "diff", "--quiet", "HEAD", "--"], timeout=30).returncode != 0
    want = head.stdout.strip() + ("-dirty" if dirty else "")
    (whl,) = dist.glob("fabricmon-*.whl")
    (sdist,) = dist.glob("fabricmon-*.tar.gz")
    assert whl.name.startswith(f"fabricmon-{__version__}-") and sdist.name == f"fabricmon-{__version__}.tar.gz"
    with tarfile.open(sdist) as tar:
        (rev,) = [m for m in tar.getmembers() if m.name.endswith("/REVISION") and m.name.count("/") == 1]
        assert tar.extractfile(rev).read().decode().strip() == want
        assert not [m for m in tar.getnames() if "/.git/" in m or m.endswith("/.git")]
    module = zipfile.ZipFile(whl).read("fabricmon/_revision.py").decode()
    ns: dict = {}
    exec(compile(module, "_revision.py", "exec"), ns)
    assert ns["REVISION"] == want
