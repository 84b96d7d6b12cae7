"""docs/configuration.md is generated from the config classes and matches the code.

- regenerating it changes nothing, every key has a meaning, and docs/config-meanings.yaml names
  only keys that exist (scripts/config_reference.py --check, as CI runs it);
- every key of the agent, aggregator and topology classes is in the document, and each default
  shown is the loader's default (an empty file loaded by the real loaders);
- the SIGHUP column is what a reload does: each key's value is changed and handed to the real
  reload paths (fabricmon.agent.runtime.Agent.reload, fabricmon.aggregator.service.reload_aggregator),
  which either apply it ("yes") or refuse it with ConfigError ("restart").
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import subprocess
import sys
import types
import typing

from fabricmon.configload import ConfigError
from support.promtools import REPO

SCRIPT = REPO / "scripts" / "config_reference.py"
DOC = REPO / "docs" / "configuration.md"


def _module():
    spec = importlib.util.spec_from_file_location("config_reference", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    sys.modules["config_reference"] = mod  # its dataclass needs its module registered
    spec.loader.exec_module(mod)
    return mod


def _rows() -> dict[str, dict[str, dict[str, str]]]:
    """The document's tables: config title -> key -> {Type, Default, SIGHUP, Meaning}."""
    out: dict[str, dict[str, dict[str, str]]] = {}
    title = ""
    for ln in DOC.read_text().splitlines():
        if ln.startswith("## "):
            title = ln[3:].split(" ")[0]
            out[title] = {}
        elif ln.startswith("| ") and title and not ln.startswith("| Key"):
            cells = [c.strip() for c in ln.strip("|").replace("\\|", "\x00").split("|")]
            cells = [c.replace("\x00", "|") for c in cells]
            key = cells[0].strip("*`")
            out[title][key] = {"Type": cells[1].strip("`"), "Default": cells[2].strip("`"),
                               "SIGHUP": cells[3], "Meaning": cells[4]}
    return out


def test_generated_reference_is_up_to_date() -> None:
    res = subprocess.run([sys.executable, str(SCRIPT), "--check"], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr


def test_every_key_is_documented_with_a_meaning() -> None:
    from fabricmon.aggregator.config import AggregatorConfig
    from fabricmon.config import AgentConfig
    from fabricmon.topology import TopologyFile

    rows = _rows()
    mod = _module()

    def paths(cls, prefix=""):
        for f in dataclasses.fields(cls):
            yield prefix + f.name
            sub, many = mod._nested(typing.get_type_hints(cls)[f.name])
            if sub is not None:
                yield from paths(sub, f"{prefix}{f.name}{'[]' if many else ''}.")

    for title, cls in (("Agent", AgentConfig), ("Aggregator", AggregatorConfig), ("Topology", TopologyFile)):
        want = set(paths(cls))
        assert set(rows[title]) == want, (title, set(rows[title]) ^ want)
        for key, row in rows[title].items():
            assert row["Meaning"], (title, key)
    # The meanings file cannot name a key that does not exist.
    assert mod.problems() == []


def _value_at(obj, path: str):
    for part in path.split("."):
        obj = getattr(obj, part)
    return obj


def test_defaults_are_the_loaders_defaults(tmp_path) -> None:
    from fabricmon.aggregator.config import load_aggregator_config
    from fabricmon.config import load_agent_config

    rows = _rows()
    agent = load_agent_config(None)
    (tmp_path / "t.yaml").write_text("generate: {nodes: 4}\n")
    (tmp_path / "a.yaml").write_text("topology: t.yaml\nauth: {insecure: true}\n")
    aggregator = load_aggregator_config(tmp_path / "a.yaml")
    for title, cfg, skip in (("Agent", agent, ()), ("Aggregator", aggregator, ("topology", "auth.insecure"))):
        for key, row in rows[title].items():
            if "[]" in key or key in skip or row["Default"] in ("(section)", "required"):
                continue
            try:
                value = _value_at(cfg, key)
            except AttributeError:
                continue  # inside an optional section that is unset by default (shard.kubernetes...)
            shown = row["Default"]
            if shown == "unset":
                assert value is None, (title, key, value)
            elif key.endswith("_mode"):
                assert value == int(shown, 8), (title, key)
            else:
                assert json.loads(shown) == (list(value) if isinstance(value, tuple) else value), (title, key, value)


def _changed(value):
    """A different value of the same shape (reload paths compare, they do not validate)."""
    if dataclasses.is_dataclass(value):
        for f in dataclasses.fields(value):
            try:
                return dataclasses.replace(value, **{f.name: _changed(getattr(value, f.name))})
            except TypeError:
                continue
        raise TypeError(value)
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1
    if isinstance(value, float):
        return value * 0.5 if 0 < value < 1 else value + 1.0
    if isinstance(value, str):
        return value + "x"
    if isinstance(value, tuple):
        return value[:-1] if value else ("x",)
    if isinstance(value, dict):
        return {**value, "mlx5_99": 3}
    if value is None:
        return "x"
    raise TypeError(value)


def test_agent_sighup_column_is_what_reload_does(tmp_path) -> None:
    from fabricmon.agent.runtime import build_agent
    from fabricmon.config import load_agent_config

    rows = _rows()["Agent"]
    (tmp_path / "sys").mkdir()
    base = load_agent_config(None, {"sysfs_root": str(tmp_path / "sys"), "nvml": "off", "listen": "127.0.0.1:0"})
    checked = 0
    for f in dataclasses.fields(base):
        if f.name == "shard":
            continue  # a section that is unset by default: a changed value is a whole new section
        agent = build_agent(base, inline_sources=True)
        try:
            new = dataclasses.replace(base, **{f.name: _changed(getattr(base, f.name))})
            try:
                agent.reload(new)
                did = "yes"
            except ConfigError:
                did = "restart"
        finally:
            agent.stop()
        assert rows[f.name]["SIGHUP"] == did, (f.name, did)
        for key, row in rows.items():  # a section's keys say what the section does
            if key.startswith(f.name + "."):
                assert row["SIGHUP"] == did, (key, did)
        checked += 1
    assert checked >= 12


def _aggregator_reload(base, new, topology) -> None:
    """The aggregator's SIGHUP decision for ``new``: returns when it would apply it, raises
    ConfigError when it refuses.  The reload moved to aggregator/reload.py (Reloader.prepare, which
    also re-reads the files the config names) on main while this branch was open; either is real."""
    from fabricmon.aggregator.config import DetectionSettings
    from fabricmon.aggregator.engine import Engine

    engine = Engine(topology, DetectionSettings())
    try:
        from fabricmon.aggregator.reload import Reloader  # type: ignore[import-not-found]
    except ImportError:
        from fabricmon.aggregator.service import reload_aggregator

        reload_aggregator(types.SimpleNamespace(engine=engine), base, new)
        return
    from fabricmon.buildinfo import ReloadStatus

    rt = types.SimpleNamespace(engine=engine, grpc=None)
    Reloader(rt, base, ReloadStatus(), load=lambda: new).prepare(new)


def test_aggregator_sighup_column_is_what_reload_does(tmp_path) -> None:
    from fabricmon.aggregator.config import load_aggregator_config
    from fabricmon.topology import load_topology

    rows = _rows()["Aggregator"]
    (tmp_path / "t.yaml").write_text("generate: {nodes: 4}\n")
    (tmp_path / "a.yaml").write_text("topology: t.yaml\nauth: {insecure: true}\n")
    base = load_aggregator_config(tmp_path / "a.yaml")
    topology = load_topology(base.topology)
    for key, row in rows.items():
        top, _, rest = key.partition(".")
        section = getattr(base, top)
        if rest:
            if not dataclasses.is_dataclass(section) or "." in rest:
                continue
            new = dataclasses.replace(base, **{top: dataclasses.replace(
                section, **{rest: _changed(getattr(section, rest))})})
        else:
            new = dataclasses.replace(base, **{top: _changed(section)})
        try:
            _aggregator_reload(base, new, topology)
            did = "yes"
        except ConfigError:
            did = "restart"
        assert row["SIGHUP"] == did, (key, did)


def test_reference_is_linked() -> None:
    assert "docs/configuration.md" in (REPO / "README.md").read_text()
    for name in ("agent", "aggregator"):
        assert "docs/configuration.md" in (REPO / "systemd" / "etc" / "fabricmon" / f"{name}.yaml").read_text()
