"""The image, built with buildah from the pinned Debian base and run with podman, against the venv install.

In CI (scripts/test.sh installs buildah, podman, runc and mmdebstrap): scripts/build-image.sh makes the
pinned mmdebstrap base (deploy/image/base.env), fills the wheelhouse from the hash locks with this
venv's pip (its cache holds what CI's own install fetched) and runs buildah on the Containerfile, whose
RUN steps install from that wheelhouse with no network; then the image runs.  What it holds the image
to: `fabricmon --version` equal to the venv's, `agent --once` over a fixture tree mounted in giving the
venv's exposition (less times, the python_version and revision labels), and the aggregator starting from
a config mounted in, ready and exporting the same metric families as the venv's aggregator on that config.
deploy/README.md gives the measured times (CI's budget for this file is 180 s).

How it runs on a machine that is itself a container (this project's CI): rootful buildah and podman on
overlay storage of their own under pytest's temporary folder (the kernel's overlayfs: a container starts
without copying the root filesystem, as the vfs driver would: minutes), runc with the cgroupfs manager
(crun refuses cgroup v1 "hybrid" mounts), the host network, and rlimits at or under the machine's own
(podman's defaults, RLIMIT_NOFILE 1048576 and a large RLIMIT_NPROC, are refused with EPERM).  One
container runs and the commands are `podman exec`s in it, a shared directory mounted at /mnt/shared.
What a machine must allow is checked first and a skip names what is missing: root, overlayfs, the
mount/pid/ipc/uts namespaces runc makes.
"""

from __future__ import annotations

import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from support.net import free_port
from support.paths import REPO
from support.procrig import topology_yaml

# The build is most of this file's time (deploy/README.md); the suite's 300 s default would cut it
# short on a loaded machine.
pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]
TAG = "localhost/fabricmon-image-test:latest"
VENV_FABRICMON = [sys.executable, "-m", "fabricmon"]
TOOLS = ("buildah", "podman", "runc", "mmdebstrap")


def container_preconditions() -> str | None:
    """Why this machine cannot build and run the image here, or None."""
    if missing := [t for t in TOOLS if shutil.which(t) is None]:
        return f"{', '.join(missing)} not installed (scripts/test.sh installs them: apt-get install {' '.join(TOOLS)})"
    if os.geteuid() != 0:
        return f"rootful buildah and podman: the suite runs as uid {os.geteuid()}, not root"
    if "overlay" not in Path("/proc/filesystems").read_text().split():
        return ("the kernel has no overlay filesystem (/proc/filesystems): the vfs driver instead copies "
                "the root filesystem for every step and container, minutes over CI's budget")
    # What runc makes for a container on the host network: a mount, pid, ipc and uts namespace.
    res = subprocess.run(["unshare", "--mount", "--pid", "--ipc", "--uts", "--fork", "true"],
                         capture_output=True, text=True, timeout=60)
    if res.returncode != 0:
        return ("cannot create the namespaces a container needs (unshare --mount --pid --ipc --uts): "
                + res.stderr.strip())
    return None


@pytest.fixture(scope="module")
def engine(tmp_path_factory) -> Iterator[list[str]]:
    """Global buildah/podman options naming a storage of this module's own, removed afterwards."""
    if why := container_preconditions():
        pytest.skip(why)
    root = tmp_path_factory.mktemp("containers")
    # podman refuses a runroot longer than 50 characters (its sockets' paths): a short one in /run
    # (tmpfs, where the default runroot lives), not under pytest's folder (longer under xdist).
    runroot = Path(tempfile.mkdtemp(prefix="fabricmon-image-", dir="/run" if os.access("/run", os.W_OK) else None))
    opts = ["--root", str(root / "storage"), "--runroot", str(runroot), "--storage-driver", "overlay"]
    yield opts
    subprocess.run(["podman", *opts, "rm", "-af", "-t", "0"], capture_output=True, timeout=120)
    subprocess.run(["buildah", *opts, "rm", "-a"], capture_output=True, timeout=120)
    subprocess.run(["buildah", *opts, "rmi", "-af"], capture_output=True, timeout=120)
    # containers/storage leaves its overlay directory bind-mounted over itself: unmount what is under root.
    mounts = [ln.split()[4] for ln in Path("/proc/self/mountinfo").read_text().splitlines()]
    for m in sorted((m for m in mounts if m.startswith((f"{root}/", f"{runroot}/"))), key=len, reverse=True):
        subprocess.run(["umount", "-l", m], capture_output=True, timeout=60)
    shutil.rmtree(root, ignore_errors=True)
    shutil.rmtree(runroot, ignore_errors=True)


@pytest.fixture(scope="module")
def image(engine: list[str]) -> str:
    t0 = time.monotonic()
    env = {**os.environ, "FABRICMON_CONTAINERS_OPTS": " ".join(engine), "FABRICMON_BUILD_PYTHON": sys.executable}
    res = subprocess.run(["bash", str(REPO / "scripts" / "build-image.sh"), TAG], capture_output=True, text=True,
                         timeout=840, cwd=REPO, env=env)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    print(f"image built in {time.monotonic() - t0:.0f} s: {res.stdout.strip().splitlines()[-1]}")
    return TAG


def podman_run(engine: list[str], *args: str) -> list[str]:
    nofile = min(resource.getrlimit(resource.RLIMIT_NOFILE)[1], 65536)
    nproc = min(resource.getrlimit(resource.RLIMIT_NPROC)[1], 4096)
    return ["podman", *engine, "--runtime", "runc", "--cgroup-manager", "cgroupfs", "run", "--rm",
            "--network", "host", "--ulimit", f"nofile={nofile}:{nofile}", "--ulimit", f"nproc={nproc}:{nproc}", *args]


@pytest.fixture(scope="module")
def container(engine: list[str], image: str, tmp_path_factory) -> Iterator[tuple[list[str], Path]]:
    """(the argv prefix that runs a command in the running container, the host directory mounted at /mnt/shared)."""
    work = tmp_path_factory.mktemp("image-work")
    work.chmod(0o755)
    res = subprocess.run(podman_run(engine, "-d", "-v", f"{work}:/mnt/shared:ro", "--entrypoint", "sleep", image,
                                    "3600"), capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    cid = res.stdout.strip()
    podman = ["podman", *engine, "--runtime", "runc", "--cgroup-manager", "cgroupfs"]
    yield [*podman, "exec", cid], work
    subprocess.run([*podman, "rm", "-f", "-t", "0", cid], capture_output=True, timeout=120)


def _normalize(text: str) -> str:
    out = []
    for ln in text.splitlines():
        if ln.startswith(("fabricmon_collector_duration_seconds{", "fabricmon_snapshot_timestamp_seconds{")):
            continue
        out.append(re.sub(r'(python_version|revision)="[^"]*"', r'\1=""', ln))
    return "\n".join(out)


def check_version(run: list[str]) -> None:
    got = subprocess.run([*run, "fabricmon", "--version"], capture_output=True, text=True, timeout=120)
    want = subprocess.run([*VENV_FABRICMON, "--version"], capture_output=True, text=True, timeout=60)
    assert got.returncode == 0, got.stderr
    assert got.stdout.strip() == want.stdout.strip(), "the image's fabricmon --version differs from the venv's"


def check_agent_once(run: list[str], work: Path, fx: Path) -> None:
    shutil.copytree(fx, work / "fx", symlinks=True)  # sysfs trees link back up: copied as links
    subprocess.run(["chmod", "-R", "a+rX", str(work / "fx")], check=True, timeout=60)
    args = ["--log-level", "error", "agent", "--once", "--sysfs-root", "/mnt/shared/fx/sys", "--ethtool-dir",
            "/mnt/shared/fx/ethtool", "--nvml", "fake:/mnt/shared/fx/nvml.json", "--node-name", "node-007"]
    got = subprocess.run([*run, "fabricmon", *args], capture_output=True, text=True, timeout=120)
    assert got.returncode == 0, got.stderr
    local = [a.replace("/mnt/shared/fx", str(fx)) for a in args]
    want = subprocess.run([*VENV_FABRICMON, *local], capture_output=True, text=True, timeout=120)
    assert want.returncode == 0, want.stderr
    assert "fabricmon_ib_port_state{" in got.stdout
    assert _normalize(got.stdout) == _normalize(want.stdout), "the image's agent --once exposition differs"


def _families(port: int) -> set[str]:
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    return {ln.split()[2] for ln in body.splitlines() if ln.startswith("# TYPE ")}


def _ready(port: int, deadline: float) -> bool:
    while time.monotonic() < deadline:
        try:
            if urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2).status == 200:
                return True
        except OSError:
            time.sleep(0.3)
    return False


def _aggregator_config(d: Path, inside: str) -> tuple[Path, int]:
    topo = topology_yaml(d / "topology.yaml")
    hport = free_port()
    cfg = {"topology": f"{inside}/topology.yaml" if inside else str(topo),
           "grpc_listen": f"127.0.0.1:{free_port()}", "http_listen": f"127.0.0.1:{hport}",
           "auth": {"insecure": True}}
    (d / "aggregator.yaml").write_text(yaml.safe_dump(cfg))
    return d / "aggregator.yaml", hport


def check_aggregator_starts(run: list[str], work: Path, tmp_path: Path) -> None:
    fams = {}
    for kind in ("image", "venv"):
        d = (work if kind == "image" else tmp_path) / f"agg-{kind}"
        d.mkdir()
        d.chmod(0o755)
        cfg, hport = _aggregator_config(d, f"/mnt/shared/{d.name}" if kind == "image" else "")
        cfg.chmod(0o644)
        (d / "topology.yaml").chmod(0o644)
        if kind == "image":
            cmd = [*run, "fabricmon", "aggregator", "--config", f"/mnt/shared/{d.name}/aggregator.yaml"]
        else:
            cmd = [*VENV_FABRICMON, "aggregator", "--config", str(cfg)]
        log = open(d / "log", "wb")
        p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        try:
            assert _ready(hport, time.monotonic() + 90), (d / "log").read_text()[-3000:]
            fams[kind] = _families(hport)
        finally:
            p.terminate()
            p.wait(30)
            log.close()
    assert fams["image"] == fams["venv"] and "fabricmon_agents_connected" in fams["image"], fams


def test_image_runs_as_the_venv_install(container, make_fixture, tmp_path: Path) -> None:
    """One test, so one build: pytest-xdist was seen running a file's tests on both workers here (each
    building the image) even under --dist loadgroup with the file's xdist_group."""
    run, work = container
    check_version(run)
    check_agent_once(run, work, make_fixture())
    check_aggregator_starts(run, work, tmp_path)
