"""The image, built with buildah from the pinned Debian base and run with podman, against the venv install.

Opt-in (FABRICMON_IMAGE_TEST=1; FABRICMON_IMAGE=TAG tests an image already built instead): the build
alone (mmdebstrap base, then pip in two stages) takes minutes, more than CI's budget for it;
deploy/README.md gives the measured times.  What it holds the image to:
`fabricmon --version` equal to the venv's, `agent --once` over a fixture tree mounted in giving the venv's
exposition (less times, the python_version and revision labels), and the aggregator starting from a
config mounted in, ready and exporting the same metric families as the venv's aggregator on that config.

How it runs on a machine that is itself a container (this project's CI): rootful podman with vfs
storage, runc with the cgroupfs manager (crun refuses cgroup v1 "hybrid" mounts), the host network, and
rlimits under the machine's own (podman's defaults, RLIMIT_NOFILE 1048576 and a large RLIMIT_NPROC, are
refused with EPERM).  Each `podman run` copies the image's root filesystem (vfs: about 20 s here), so one
container runs and the commands are `podman exec`s in it, a shared directory mounted at /mnt/shared.
"""

from __future__ import annotations

import os
import re
import resource
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from support.net import free_port
from support.paths import REPO
from support.procrig import topology_yaml

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(os.environ.get("FABRICMON_IMAGE_TEST") != "1",
                       reason="opt-in: FABRICMON_IMAGE_TEST=1 (builds the image: minutes; deploy/README.md)"),
]
TAG = "localhost/fabricmon-image-test:latest"
VENV_FABRICMON = [sys.executable, "-m", "fabricmon"]


PODMAN = ["podman", "--runtime", "runc", "--cgroup-manager", "cgroupfs", "--storage-driver", "vfs"]


def podman_run(*args: str) -> list[str]:
    nofile = min(resource.getrlimit(resource.RLIMIT_NOFILE)[1], 65536)
    return [*PODMAN, "run", "--rm", "--network", "host", "--ulimit", f"nofile={nofile}:{nofile}",
            "--ulimit", "nproc=4096:4096", *args]


@pytest.fixture(scope="module")
def image() -> Iterator[str]:
    for tool in ("buildah", "podman", "mmdebstrap", "runc"):
        if shutil.which(tool) is None:
            pytest.fail(f"{tool} missing (apt-get install buildah podman mmdebstrap runc)")
    if os.geteuid() != 0:
        pytest.skip("rootful buildah and podman")
    if given := os.environ.get("FABRICMON_IMAGE"):  # an image already built by scripts/build-image.sh
        yield given
        return
    t0 = time.monotonic()
    res = subprocess.run(["bash", str(REPO / "scripts" / "build-image.sh"), TAG], capture_output=True, text=True,
                         timeout=1200, cwd=REPO)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    print(f"image built in {time.monotonic() - t0:.0f} s")
    yield TAG
    subprocess.run(["buildah", "--storage-driver", "vfs", "rmi", TAG], capture_output=True, timeout=120)


@pytest.fixture(scope="module")
def container(image: str, tmp_path_factory) -> Iterator[tuple[list[str], Path]]:
    """(the argv prefix that runs a command in the running container, the host directory mounted at /mnt/shared)."""
    work = tmp_path_factory.mktemp("image-work")
    work.chmod(0o755)
    res = subprocess.run(podman_run("-d", "-v", f"{work}:/mnt/shared:ro", "--entrypoint", "sleep", image, "3600"),
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    cid = res.stdout.strip()
    yield [*PODMAN, "exec", cid], work
    subprocess.run([*PODMAN, "rm", "-f", "-t", "0", cid], capture_output=True, timeout=120)


def _normalize(text: str) -> str:
    out = []
    for ln in text.splitlines():
        if ln.startswith(("fabricmon_collector_duration_seconds{", "fabricmon_snapshot_timestamp_seconds{")):
            continue
        out.append(re.sub(r'(python_version|revision)="[^"]*"', r'\1=""', ln))
    return "\n".join(out)


def test_image_version_is_the_venvs(container) -> None:
    run, _ = container
    got = subprocess.run([*run, "fabricmon", "--version"], capture_output=True, text=True, timeout=120)
    want = subprocess.run([*VENV_FABRICMON, "--version"], capture_output=True, text=True, timeout=60)
    assert got.returncode == 0, got.stderr
    assert got.stdout.strip() == want.stdout.strip()


def test_image_agent_once_exports_the_fixture_node_as_the_venv_does(container, make_fixture) -> None:
    run, work = container
    fx = make_fixture()
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
    assert _normalize(got.stdout) == _normalize(want.stdout)


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


def test_image_aggregator_starts_as_the_venvs(container, tmp_path: Path) -> None:
    run, work = container
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
    assert fams["image"] == fams["venv"] and "fabricmon_agents_connected" in fams["image"]
