"""filewatch.FileWatch, one look at a time (``check``): what counts as a change of a secret file.

The layout is the kubelet's for a Secret volume (kubernetes pkg/volume/util/atomic_writer.go):
``token -> ..data/token``, ``..data -> ..<timestamp>``; an update writes a new timestamped
directory and renames a new ``..data`` symlink over the old one.
"""

from __future__ import annotations

import os
from pathlib import Path

from fabricmon.buildinfo import ReloadStatus
from fabricmon.filewatch import FileWatch


def kubelet_secret(mount: Path, version: str, token: str) -> Path:
    """Write ``token`` as the kubelet does for one Secret update; the path the pod reads."""
    mount.mkdir(exist_ok=True)
    d = mount / f"..{version}"
    d.mkdir()
    (d / "token").write_text(token)
    tmp = mount / "..data_tmp"
    tmp.symlink_to(d.name)
    os.replace(tmp, mount / "..data")  # the atomic swap
    link = mount / "token"
    if not link.is_symlink():
        link.symlink_to("..data/token")
    return link


def test_kubelet_swap_is_seen_once_it_held_still_and_a_touch_is_not_a_change(tmp_path):
    path = kubelet_secret(tmp_path / "secret", "2026_01_01_v1", "old-token\n")
    seen: list[list[str]] = []
    status = ReloadStatus()
    w = FileWatch([str(path), None, str(path)], seen.append, status)
    assert w.paths == (str(path),) and status.files_watched == 1
    assert w.check() == []
    kubelet_secret(tmp_path / "secret", "2026_01_01_v2", "new-token\n")
    assert w.check() == []  # moved this period: wait for it to hold still (a file mid-write)
    assert w.check() == [str(path)] and seen == [[str(path)]]
    assert status.file_changes == 1
    assert w.check() == []
    os.utime(path, (1, 1))  # same contents: not a rotation
    assert w.check() == [] and w.check() == [] and len(seen) == 1


def test_a_file_still_being_written_is_handed_on_only_when_complete(tmp_path):
    f = tmp_path / "token"
    f.write_text("old-token\n")
    seen: list[list[str]] = []
    w = FileWatch([str(f)], seen.append)
    f.write_text("")  # an editor truncated it ...
    assert w.check() == []
    f.write_text("new-token\n")  # ... and wrote it before the next look
    assert w.check() == []
    assert w.check() == [str(f)] and len(seen) == 1


def test_a_removed_file_is_a_change_the_reload_then_refuses(tmp_path):
    f = tmp_path / "token"
    f.write_text("old-token\n")
    w = FileWatch([str(f)], lambda _c: None)
    f.unlink()
    assert w.check() == [] and w.check() == [str(f)]
    assert w.check() == []  # still gone: said once
