#!/usr/bin/env python3
"""Write docs/configuration.md: every key of the agent, aggregator and topology configs, from the
typed config classes (fabricmon.config.AgentConfig, fabricmon.aggregator.config.AggregatorConfig,
fabricmon.topology.TopologyFile).

    python scripts/config_reference.py           # rewrite docs/configuration.md
    python scripts/config_reference.py --check   # exit 1 if it differs (CI: tests/core/test_config_reference.py)

Per key: the type as annotated, the default (the dataclass's), the meaning and whether SIGHUP
applies it.  The meaning is the comment on the field's line in the class, else the comment lines
just above it, else the nested class's docstring for a section; keys the code leaves uncommented
get theirs from docs/config-meanings.yaml (key -> text), which may name only existing keys.
SIGHUP: the agent's Agent.RELOADABLE sections, the aggregator's `detection` (what
service.reload_aggregator applies; tests/core/test_config_reference.py exercises both); the topology is
read at start only.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import io
import json
import sys
import textwrap
import tokenize
import types
import typing
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

OUT = REPO / "docs" / "configuration.md"
MEANINGS = REPO / "docs" / "config-meanings.yaml"
AGGREGATOR_RELOADABLE = ("detection",)  # service.reload_aggregator: everything else needs a restart
AGGREGATOR_RESTART = ("detection.straggler_window",)  # service.apply_detection refuses it (history size)


@dataclass(frozen=True)
class Key:
    path: str
    type: str
    default: str
    meaning: str
    sighup: str
    section: bool
    field: tuple[str, str]  # (class, field): a class used at two places shares its meanings


def _comments(cls: type) -> dict[str, str]:
    """field -> its comment: trailing on its line, else the contiguous comment lines above it."""
    src = textwrap.dedent(inspect.getsource(cls))
    by_line: dict[int, str] = {}
    code_lines: set[int] = set()
    for tok in tokenize.generate_tokens(io.StringIO(src).readline):
        if tok.type == tokenize.COMMENT:
            by_line[tok.start[0]] = tok.string.lstrip("#").strip()
        elif tok.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT):
            code_lines.add(tok.start[0])
    out: dict[str, str] = {}
    (node,) = ast.parse(src).body
    assert isinstance(node, ast.ClassDef)
    for stmt in node.body:
        if not (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)):
            continue
        line = stmt.lineno
        text = by_line.get(line) or by_line.get(stmt.end_lineno or line, "")
        if not text:
            above = []
            n = line - 1
            while n in by_line and n not in code_lines:
                above.insert(0, by_line[n])
                n -= 1
            above = [a for a in above if not a.startswith("---")]
            text = " ".join(above)
        if text:
            out[stmt.target.id] = text
    return out


def _annotations(cls: type) -> dict[str, str]:
    src = textwrap.dedent(inspect.getsource(cls))
    (node,) = ast.parse(src).body
    return {s.target.id: ast.unparse(s.annotation) for s in node.body  # type: ignore[union-attr]
            if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)}


def _nested(tp: object) -> tuple[type | None, bool]:
    """(the dataclass a field holds, whether it is a list of them)."""
    if dataclasses.is_dataclass(tp):
        return tp, False  # type: ignore[return-value]
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis and dataclasses.is_dataclass(args[0]):
        return args[0], True
    if args and origin in (typing.Union, types.UnionType):
        for a in args:
            if dataclasses.is_dataclass(a):
                return a, False
    return None, False


def _doc(cls: type) -> str:
    doc = inspect.getdoc(cls) or ""
    if doc.startswith(cls.__name__ + "("):  # dataclass's generated signature, not a docstring
        return ""
    return " ".join(doc.split("\n\n")[0].split())


def _default(f: dataclasses.Field) -> str:
    if f.default is not dataclasses.MISSING:
        value = f.default
    elif f.default_factory is not dataclasses.MISSING:
        value = f.default_factory()
        if dataclasses.is_dataclass(value):
            return "(section)"
    else:
        return "required"
    if value is None:
        return "unset"
    if isinstance(value, int) and not isinstance(value, bool) and f.name.endswith("_mode"):
        return f"0{value:o}"  # file modes, written unquoted in octal (0666)
    if isinstance(value, tuple):
        value = list(value)
    if isinstance(value, (list, dict, str, bool, int, float)):
        return json.dumps(value)
    return repr(value)


def walk(cls: type, prefix: str, sighup, meanings: dict[str, str]) -> Iterator[Key]:
    hints = typing.get_type_hints(cls)
    notes = _comments(cls)
    ann = _annotations(cls)
    for f in dataclasses.fields(cls):
        path = f"{prefix}{f.name}"
        sub, many = _nested(hints[f.name])
        meaning = meanings.get(path) or notes.get(f.name) or (_doc(sub) if sub is not None else "")
        yield Key(path, ann[f.name], _default(f), meaning, sighup(path), sub is not None, (cls.__qualname__, f.name))
        if sub is not None:
            yield from walk(sub, f"{path}[]." if many else f"{path}.", sighup, meanings)


def agent_sighup(path: str) -> str:
    from fabricmon.agent.runtime import Agent

    return "yes" if path.split(".")[0].split("[")[0] in Agent.RELOADABLE else "restart"


def aggregator_sighup(path: str) -> str:
    return "yes" if path.split(".")[0] in AGGREGATOR_RELOADABLE and path not in AGGREGATOR_RESTART else "restart"


def configs():
    from fabricmon.aggregator.config import AggregatorConfig
    from fabricmon.config import AgentConfig
    from fabricmon.topology import TopologyFile

    return [
        ("Agent", "agent.yaml", "fabricmon agent --config FILE; every top-level scalar also has a flag of "
         "the same name (`--sysfs-root` for `sysfs_root`), and flags win", AgentConfig, agent_sighup),
        ("Aggregator", "aggregator.yaml", "fabricmon aggregator --config FILE", AggregatorConfig, aggregator_sighup),
        ("Topology", "topology.yaml", "named by the aggregator's `topology` key (relative to its file), and "
         "by an agent's `shard.topology`", TopologyFile, lambda path: "restart"),
    ]


def keys(meanings: dict[str, str]) -> dict[str, list[Key]]:
    out = {}
    for title, _, _, cls, sighup in configs():
        ks = list(walk(cls, "", sighup, {k.split(":", 1)[1]: v for k, v in meanings.items()
                                         if k.split(":", 1)[0] == title.lower()}))
        # The same class at another key (topology nodes[].nics[] and nodes[].unbound[]): same meanings.
        shared = {k.field: k.meaning for k in ks if k.meaning}
        out[title] = [k if k.meaning else dataclasses.replace(k, meaning=shared.get(k.field, "")) for k in ks]
    return out


def load_meanings() -> dict[str, str]:
    data = yaml.safe_load(MEANINGS.read_text()) if MEANINGS.exists() else {}
    return {str(k): " ".join(str(v).split()) for k, v in (data or {}).items()}


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render() -> str:
    meanings = load_meanings()
    by_config = keys(meanings)
    lines = [
        "# Configuration reference",
        "",
        "<!-- GENERATED by scripts/config_reference.py from the config classes: do not edit; run the script. -->",
        "",
        "Every key of the three config files, from the typed config classes the loaders fill "
        "(`fabricmon.config.AgentConfig`, `fabricmon.aggregator.config.AggregatorConfig`, "
        "`fabricmon.topology.TopologyFile`). An unknown key is refused with the file and key named. "
        "`fabricmon check-config FILE` validates a file without starting anything. **SIGHUP**: `yes` "
        "when `systemctl reload` (SIGHUP) applies a change of the key to the running process; `restart` "
        "when a change is refused with `config_reload_failed` and the process runs on with the config "
        "it had until restarted. Keys ending in `[]` are lists of sections.",
        "",
    ]
    for title, filename, how, _, _ in configs():
        lines += [f"## {title} (`{filename}`)", "", f"Read by {how}.", "",
                  "| Key | Type | Default | SIGHUP | Meaning |", "|---|---|---|---|---|"]
        for k in by_config[title]:
            key = f"**`{k.path}`**" if k.section else f"`{k.path}`"
            lines.append(f"| {key} | `{_cell(k.type)}` | `{_cell(k.default)}` | {k.sighup} | {_cell(k.meaning)} |")
        lines.append("")
    return "\n".join(lines)


def problems() -> list[str]:
    """Keys without a meaning, and entries of config-meanings.yaml that name no key."""
    meanings = load_meanings()
    by_config = keys(meanings)
    out = [f"{title.lower()}:{k.path}: no meaning (comment the field, or add it to {MEANINGS.name})"
           for title, ks in by_config.items() for k in ks if not k.meaning]
    known = {f"{title.lower()}:{k.path}" for title, ks in by_config.items() for k in ks}
    out += [f"{MEANINGS.name}: {name}: no such key" for name in meanings if name not in known]
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args()
    bad = problems()
    if bad:
        print("\n".join(bad), file=sys.stderr)
        return 1
    text = render()
    if args.check:
        if not OUT.exists() or OUT.read_text() != text:
            print(f"{OUT.relative_to(REPO)} is stale: run python scripts/config_reference.py", file=sys.stderr)
            return 1
        return 0
    OUT.parent.mkdir(exist_ok=True)
    OUT.write_text(text)
    print(f"wrote {OUT.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
