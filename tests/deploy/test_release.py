"""Static release checks (no container engine runs in CI): one version, a pinned base image, and the
hash locks being exactly what the Containerfile, scripts/install.sh and scripts/test.sh install.

Each check reads the files as the tools would (the Containerfile's ARG/FROM/RUN lines, pip's
requirement syntax through `packaging`), and each has a counter-case showing it can fail.
"""

from __future__ import annotations

import datetime
import re
import subprocess
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from fabricmon import __version__
from support import toml as tomllib
from support.promtools import REPO

CONTAINERFILE = REPO / "Containerfile"
LOCKS = REPO / "requirements"
# An exact tag (major.minor.patch and a variant), optionally with the digest a release pins.
# The image's repository: not ghcr.io/fabricmon/fabricmon, which an unrelated InfiniBand monitor of that name
# could claim; the package, CLI, units and metric prefix stay fabricmon.
IMAGE = "ghcr.io/gpu-fabricmon/gpu-fabricmon"
PROJECT_URL = "https://github.com/gpu-fabricmon/gpu-fabricmon"
BASE_ENV = REPO / "deploy" / "image" / "base.env"


def _containerfile_runs(text: str) -> list[str]:
    """The shell of every RUN instruction, continuation lines joined."""
    joined = re.sub(r"\\\n\s*", " ", text)
    return [ln[4:].strip() for ln in joined.splitlines() if ln.startswith("RUN ")]


def _args(text: str) -> dict[str, str]:
    return dict(m.groups() for m in re.finditer(r"^ARG (\w+)=(.*)$", text, re.M))


def parse_lock(path: Path) -> dict[str, tuple[Version, int]]:
    """name -> (pinned version, number of hashes); raises on a line pip --require-hashes would refuse."""
    out: dict[str, tuple[Version, int]] = {}
    joined = re.sub(r"\\\n\s*", " ", path.read_text())
    for ln in joined.splitlines():
        ln = ln.split(" #", 1)[0].strip()
        if not ln or ln.startswith("#"):
            continue
        spec, *opts = ln.split(" --hash=")
        req = Requirement(spec.strip())
        (op_version,) = list(req.specifier)
        assert op_version.operator == "==", f"{path.name}: {ln[:80]}: not pinned with =="
        hashes = [o for o in opts if o.startswith("sha256:")]
        assert hashes, f"{path.name}: {req.name}: no --hash (pip --require-hashes refuses it)"
        out[canonicalize_name(req.name)] = (Version(op_version.version), len(hashes))
    return out


def _project() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())


def uncovered(lock: dict[str, tuple[Version, int]], requirements: list[str]) -> list[str]:
    """Requirements the lock does not pin, or pins outside their specifier."""
    bad = []
    for r in map(Requirement, requirements):
        name = canonicalize_name(r.name)
        if name == "fabricmon":
            continue  # the self-reference (test -> fabricmon[aggregator]): installed with --no-deps
        if name not in lock or not r.specifier.contains(lock[name][0], prereleases=True):
            bad.append(str(r))
    return bad


# ------------------------------------------------------------ one version

def test_one_version_source() -> None:
    project = _project()
    assert "version" not in project["project"] and project["project"]["dynamic"] == ["version"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "fabricmon.__version__"}
    Version(__version__)  # a valid PEP 440 version
    assert _args(CONTAINERFILE.read_text())["VERSION"] == __version__
    changelog = (REPO / "CHANGELOG.md").read_text()
    newest = re.search(r"^## \[([^\]]+)\]", changelog, re.M)
    assert newest and newest.group(1) == __version__, "CHANGELOG.md's newest entry is not the package version"
    # Every image the manifests name carries that version (or is pinned by digest).
    tags = set(re.findall(rf"image: {re.escape(IMAGE)}:(\S+)", "".join(
        p.read_text() for p in (REPO / "deploy" / "kubernetes").rglob("*.yaml"))))
    assert tags == {__version__}, tags


# ------------------------------------------------------------ base image

def _base_env() -> dict[str, str]:
    return dict(ln.split("=", 1) for ln in BASE_ENV.read_text().splitlines() if ln and not ln.startswith("#"))


def test_base_is_the_pinned_debian_root_filesystem() -> None:
    text = CONTAINERFILE.read_text()
    froms = re.findall(r"^FROM (.+)$", text, re.M)
    # No registry image: the base stage is the mmdebstrap root filesystem, every other stage builds on it.
    assert froms[0] == "scratch AS base" and all(f.startswith("base AS ") for f in froms[1:]), froms
    assert re.findall(r"^ADD (.+)$", text, re.M) == ["build/image/rootfs.tar /"]
    assert "!build/image/rootfs.tar" in (REPO / ".dockerignore").read_text().splitlines()
    env = _base_env()
    assert re.fullmatch(r"\d{8}T\d{6}Z", env["DEBIAN_SNAPSHOT"])
    assert re.fullmatch(r"[0-9a-f]{64}", env["BASE_ROOTFS_SHA256"])
    assert env["DEBIAN_SUITE"] == "bookworm" and "python3-venv" in env["BASE_PACKAGES"].split(",")
    # The wheelhouse is fetched for the base's own interpreter (scripts/build-image.sh).
    assert env["BASE_PYTHON"] == "3.11" and re.fullmatch(r"2\.\d+", env["BASE_GLIBC"])
    # The snapshot is the archive state SOURCE_DATE_EPOCH names (what makes the tarball reproducible).
    epoch = datetime.datetime.fromtimestamp(int(env["SOURCE_DATE_EPOCH"]), datetime.timezone.utc)
    assert epoch.strftime("%Y%m%dT%H%M%SZ") == env["DEBIAN_SNAPSHOT"]
    build_base = (REPO / "scripts" / "build-base.sh").read_text()
    assert "BASE_ROOTFS_SHA256" in build_base and "sha256sum" in build_base
    assert '--variant="$BASE_VARIANT" --include="$BASE_PACKAGES"' in build_base
    res = subprocess.run(["bash", str(REPO / "scripts" / "pin-base-image.sh"), "--check"], capture_output=True,
                         text=True, timeout=30)
    assert res.returncode == 0 and env["BASE_ROOTFS_SHA256"] in res.stdout, res.stdout + res.stderr
    # The release steps run the pin.
    assert "scripts/pin-base-image.sh" in (REPO / "CHANGELOG.md").read_text().split("## [")[0]


def test_image_name_is_its_own_everywhere() -> None:
    """Manifests, runbook_url (the rules) and runbook_base (every aggregator config) name the same project."""
    tracked = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, timeout=30).stdout.split()
    texts = {f: (REPO / f).read_text(errors="replace") for f in tracked
             if (REPO / f).is_file() and not f.startswith(("requirements/", "tests/fixtures/"))}
    old = [f for f, t in texts.items() if "ghcr.io/fabricmon/fabricmon" in t or "github.com/fabricmon/fabricmon" in t]
    assert [f for f in old if f not in ("CHANGELOG.md", "tests/deploy/test_release.py")] == [], old
    images = {m for t in texts.values() for m in re.findall(r"image: (\S+?):", t) if "fabricmon" in m}
    assert images == {IMAGE}, images
    bases = {m for t in texts.values() for m in re.findall(r'runbook_base: "?(https?://[^"\s]+)', t)}
    assert bases and all(b.startswith(PROJECT_URL + "/") for b in bases), bases
    urls = {m for t in texts.values() for m in re.findall(r"runbook_url: \"?(https?://[^\"\s]+)", t)}
    assert urls and all(u.startswith(PROJECT_URL + "/") for u in urls), sorted(urls)[:5]
    assert f"`{IMAGE}`" in (REPO / "CHANGELOG.md").read_text()


# ------------------------------------------------------------ the locks

@pytest.mark.parametrize("lock,extras", [("agent.lock", []), ("aggregator.lock", ["aggregator"]),
                                         ("test.lock", ["test", "aggregator"]), ("py3.10/agent.lock", []),
                                         ("py3.10/aggregator.lock", ["aggregator"]),
                                         ("py3.10/test.lock", ["test", "aggregator"]),
                                         ("py3.10/smoke.lock", ["smoke", "aggregator"])])
def test_lock_covers_the_project(lock: str, extras: list[str]) -> None:
    pinned = parse_lock(LOCKS / lock)
    project = _project()["project"]
    wanted = list(project["dependencies"])
    for e in extras:
        if e == "smoke":  # the smoke set's share of the test extra (scripts/lock.sh)
            wanted += [r for r in project["optional-dependencies"]["test"]
                       if Requirement(r).name in {"pytest", "hypothesis", "pytest-timeout", "setuptools"}]
        else:
            wanted += project["optional-dependencies"][e]
    if lock.startswith("py3.10/"):  # what a marker leaves out on 3.10
        env = {"python_version": "3.10", "python_full_version": "3.10.0", "extra": ""}
        wanted = [r for r in wanted if Requirement(r).marker is None or Requirement(r).marker.evaluate(env)]
        assert "tomli" in pinned or lock != "py3.10/test.lock"  # pytest's own need on 3.10
    assert uncovered(pinned, wanted) == []
    assert "fabricmon" not in pinned and "file://" not in (LOCKS / lock).read_text()
    if "aggregator" not in extras:
        assert "numpy" not in pinned  # agent nodes install no numpy
    # Can fail: a requirement the lock pins outside its specifier, or not at all.
    assert uncovered(pinned, ["psutil<1"]) == ["psutil<1"] and uncovered(pinned, ["no-such-package"])


def test_build_lock_covers_the_build_stage() -> None:
    pinned = parse_lock(LOCKS / "build.lock")
    wanted = [ln for ln in (LOCKS / "build.in").read_text().splitlines() if ln and not ln.startswith("#")]
    assert uncovered(pinned, wanted) == []
    backend = _project()["build-system"]["requires"]
    assert uncovered(pinned, backend) == []  # --no-isolation builds with the locked setuptools


def test_parse_lock_refuses_what_pip_would() -> None:
    tmp = LOCKS / "build.lock"
    text = tmp.read_text()
    for broken in (re.sub(r"(?m)^(\w[\w.-]*)==", r"\1>=", text, count=1),
                   re.sub(r" \\\n\s+--hash=sha256:[0-9a-f]+", "", text)):
        path = Path(str(tmp) + ".broken-test")
        try:
            path.write_text(broken)
            with pytest.raises(AssertionError):
                parse_lock(path)
        finally:
            path.unlink(missing_ok=True)


def test_containerfile_installs_the_locks_and_nothing_else() -> None:
    text = CONTAINERFILE.read_text()
    pip_installs = [cmd for run in _containerfile_runs(text) for cmd in run.split("&&") if "pip install" in cmd]
    assert pip_installs
    copied = " ".join(ln for ln in text.splitlines() if ln.startswith("COPY "))
    locks_installed = []
    for cmd in pip_installs:
        words = cmd.split()
        # From the wheelhouse alone: the build reaches no index.
        assert "--no-index" in words, cmd
        if "-r" in words:
            assert "--require-hashes" in words, cmd
            lock = words[words.index("-r") + 1].strip('"')
            locks_installed.append(lock)
        else:
            # Nothing resolved beside a lock: only the project's own wheel, with --no-deps.
            assert "--no-deps" in words and words[-1].endswith(".whl"), cmd
    # The build stage's lock, and the runtime's lock chosen by EXTRAS (aggregator by default, agent without).
    assert "requirements/build.lock" in locks_installed
    runtime = [lk for lk in locks_installed if "EXTRAS" in lk]
    assert runtime == ["/tmp/requirements/${EXTRAS:-agent}.lock"], locks_installed
    extras = _args(text)["EXTRAS"]
    for value in (extras, ""):
        name = f"{value or 'agent'}.lock"
        assert (LOCKS / name).is_file() and f"requirements/{name}" in copied, name
    assert "requirements/build.lock" in copied
    # The wheel is built with the locked backend, not an isolated download.
    assert "python -m build --no-isolation" in text
    # The wheelhouse the RUN steps mount holds what the locks pin, hash-checked, and only wheels.
    assert "!build/image/wheels" in (REPO / ".dockerignore").read_text().splitlines()
    assert text.count("--mount=type=bind,source=build/image/wheels,") == 2
    build_image = re.sub(r"\\\n\s*", " ", (REPO / "scripts" / "build-image.sh").read_text())
    download = next(ln for ln in build_image.splitlines() if "pip download" in ln)
    assert "--require-hashes" in download and "--only-binary=:all:" in download
    assert '-r "requirements/$lock.lock"' in download and 'for lock in build "${extras:-agent}"' in build_image


def test_ci_and_the_installer_install_the_locks() -> None:
    test_sh = (REPO / "scripts" / "test.sh").read_text()
    lines = [ln for ln in test_sh.splitlines() if "pip install" in ln and not ln.lstrip().startswith("#")]
    i = next(i for i, ln in enumerate(lines) if "--require-hashes -r requirements/test.lock" in ln)
    assert "--no-deps" in lines[i + 1] and lines[i + 1].rstrip().endswith("-e ."), lines
    # Nothing else is resolved from the index but pip itself.
    assert all("--require-hashes" in ln or "--no-deps" in ln or "--upgrade pip" in ln for ln in lines), lines
    install = (REPO / "scripts" / "install.sh").read_text()
    assert '--require-hashes -r "$lock"' in install and '--no-deps "$WHEEL"' in install


def test_revision_reaches_the_image() -> None:
    text = CONTAINERFILE.read_text()
    assert 'FABRICMON_REVISION="${REVISION}" /build/bin/python -m build' in text
    assert 'org.opencontainers.image.revision="${REVISION}"' in text
    assert "setup.py" in " ".join(ln for ln in text.splitlines() if ln.startswith("COPY "))
