"""Load YAML into frozen dataclasses, rejecting bad input with file:field errors.

Every error names the file, the key path and the problem on one line, e.g.
``agent.yaml: sources.ethtool.allow[2]: not a valid regex (unbalanced parenthesis)``.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
import types
import typing
from itertools import accumulate
from pathlib import Path
from typing import Any, TypeVar

import yaml

T = TypeVar("T")


class ConfigError(ValueError):
    """A config problem; ``str()`` is the one-line message for the user."""


def _join(path: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else key


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in typing.get_args(tp) if a is not type(None))
    if origin in (list, tuple):
        return "a list"
    if origin is dict:
        return "a mapping"
    if dataclasses.is_dataclass(tp):
        return "a mapping"
    return {int: "an integer", float: "a number", str: "a string", bool: "true or false"}.get(tp, str(tp))


def convert(tp: Any, value: Any, path: str, source: str) -> Any:
    """Convert a YAML value to ``tp`` or raise ConfigError naming ``path``."""

    def fail(problem: str) -> ConfigError:
        return ConfigError(f"{source}: {path or '<top>'}: {problem}")

    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        non_none = [a for a in args if a is not type(None)]
        if len(non_none) == 1:
            return convert(non_none[0], value, path, source)
        if set(non_none) == {int, str}:  # a port number or a port name (leaf_port: 17 or Ethernet1/1)
            if isinstance(value, (int, str)) and not isinstance(value, bool):
                return value
            raise fail(f"expected an integer or a string, got {type(value).__name__}")
        raise fail("unsupported union type")
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        if value is None:
            value = {}
        if not isinstance(value, dict):
            raise fail(f"expected a mapping, got {type(value).__name__}")
        return build(tp, value, path, source)
    if origin in (list, tuple):
        if value is None:
            value = []
        if not isinstance(value, list):
            raise fail(f"expected a list, got {type(value).__name__}")
        inner = args[0] if args else Any
        items = [convert(inner, v, _join(path, i), source) for i, v in enumerate(value)]
        return tuple(items)
    if origin is dict:
        if value is None:
            value = {}
        if not isinstance(value, dict):
            raise fail(f"expected a mapping, got {type(value).__name__}")
        kt, vt = args
        return {convert(kt, k, _join(path, str(k)), source): convert(vt, v, _join(path, str(k)), source)
                for k, v in value.items()}
    if tp is Any:
        return value
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise fail(f"expected true or false, got {value!r}")
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise fail(f"expected an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise fail(f"expected a number, got {value!r}")
        try:
            number = float(value)
        except OverflowError:
            raise fail(f"number too large ({len(str(value))} digits)") from None
        # NaN compares false with every bound, so a later "> 0" check would let it through.
        if not math.isfinite(number):
            raise fail(f"must be a finite number, got {value!r}")
        return number
    if tp is str:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return str(value)
        if not isinstance(value, str):
            raise fail(f"expected a string, got {type(value).__name__}")
        return value
    raise fail(f"unsupported type {tp}")


@functools.cache
def _class_shape(cls: type) -> tuple[dict[str, Any], dict[str, dataclasses.Field]]:
    # resolved once per class: a topology builds one object per node, GPU and NIC (36,865 at 4,096 nodes)
    return typing.get_type_hints(cls), {f.name: f for f in dataclasses.fields(cls)}


def build(cls: type[T], data: dict, path: str, source: str) -> T:
    """Build dataclass ``cls`` from a mapping; unknown keys are errors.

    Keys may be spelled with hyphens as on the command line.  After the fields
    are converted the class's ``validate(path, source)`` (if any) runs.
    """
    shape_of: type = cls  # mypy does not take a type[T] for Hashable (functools.cache)
    hints, fields = _class_shape(shape_of)
    kwargs: dict[str, Any] = {}
    for raw_key, value in data.items():
        key = str(raw_key).replace("-", "_")
        if key not in fields:
            known = ", ".join(sorted(fields))
            raise ConfigError(f"{source}: {_join(path, str(raw_key))}: unknown key (known: {known})")
        kwargs[key] = convert(hints[key], value, _join(path, key), source)
    try:
        obj = cls(**kwargs)
    except TypeError as exc:  # a required field is missing
        missing = [n for n, f in fields.items() if n not in kwargs
                   and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
        raise ConfigError(f"{source}: {_join(path, missing[0]) if missing else path}: required key missing") from exc
    validate = getattr(obj, "validate", None)
    if validate is not None:
        validate(path, source)
    return obj


def check_range(value: float, lo: float | None, hi: float | None, path: str, source: str, unit: str = "") -> None:
    """``value`` finite and within ``[lo, hi]`` (either bound may be None), or a ConfigError naming ``path``."""
    u = f" {unit}" if unit else ""
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"{source}: {path}: must be a finite number, got {value}")
    if lo is not None and value < lo:
        raise ConfigError(f"{source}: {path}: must be >= {lo:g}{u}, got {value}")
    if hi is not None and value > hi:
        raise ConfigError(f"{source}: {path}: must be <= {hi:g}{u}, got {value}")


def find_duplicate_keys(node: yaml.Node, path: str = "") -> tuple[str, int, int] | None:
    """The first mapping key written twice in a composed YAML document: (key path, first line, second line).

    PyYAML keeps the last of duplicate keys silently, so ``interval: 1`` and a
    forgotten ``interval: 0.01`` further down would quietly win.
    """
    stack: list[tuple[yaml.Node, str]] = [(node, path)]
    seen_nodes: set[int] = set()
    while stack:
        cur, where = stack.pop()
        if id(cur) in seen_nodes:  # an alias shares its node: check it once
            continue
        seen_nodes.add(id(cur))
        if isinstance(cur, yaml.MappingNode):
            first: dict[str, int] = {}
            for key_node, value_node in cur.value:
                if isinstance(key_node, yaml.ScalarNode):
                    if key_node.tag == "tag:yaml.org,2002:merge":
                        continue
                    key = key_node.value
                    line = key_node.start_mark.line + 1
                    if key in first:
                        return _join(where, key), first[key], line
                    first[key] = line
                    stack.append((value_node, _join(where, key)))
                else:
                    stack.append((value_node, where))
        elif isinstance(cur, yaml.SequenceNode):
            stack.extend((item, _join(where, i)) for i, item in enumerate(cur.value))
    return None


# libyaml (PyYAML's C loader) reads a 4,096-node topology in about a second where the pure-Python
# loader takes tens of seconds, but its composer recurses in C: 100,000 nested "[", or "- - - ..." on
# one line, overflow the stack and kill the process (SIGSEGV) instead of raising.  Nesting depth is at
# most the longest line (block levels need an indentation column or an indicator on the line each)
# plus the flow depth ("[", "{"); texts where that bound passes what the C loader survives with a
# wide margin (10,000 measured) go to the pure-Python loader, whose RecursionError is caught below.
_FLOW_DEPTH = {"[": 1, "{": 1, "]": -1, "}": -1}
_C_LOADER_MAX_DEPTH = 1000
_NOT_BRACKETS = re.compile(r"[^\[\]{}]+")


def _loader_for(text: str) -> type:
    if not getattr(yaml, "__with_libyaml__", False):
        return yaml.SafeLoader
    if max(map(len, text.splitlines()), default=0) > _C_LOADER_MAX_DEPTH:
        return yaml.SafeLoader
    brackets = _NOT_BRACKETS.sub("", text)  # brackets inside quotes count too: only ever safer
    if brackets and max(accumulate(map(_FLOW_DEPTH.__getitem__, brackets))) > _C_LOADER_MAX_DEPTH:
        return yaml.SafeLoader
    return yaml.CSafeLoader


def parse_yaml(text: str, source: str) -> Any:
    """``yaml.safe_load`` that also rejects duplicate mapping keys, with ``source: path: problem`` errors."""
    try:
        loader = _loader_for(text)(text)
        try:
            node = loader.get_single_node()  # composed once, checked, then constructed
            if node is None:
                return None
            dup = find_duplicate_keys(node)
            if dup is not None:
                key, a, b = dup
                raise ConfigError(f"{source}: {key}: duplicate key (lines {a} and {b})")
            return loader.construct_document(node)
        finally:
            loader.dispose()
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark is not None else "<top>"
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"{source}: {where}: invalid YAML ({problem})") from exc
    except RecursionError:  # PyYAML composes recursively: "[[[[..." thousands deep
        raise ConfigError(f"{source}: <top>: invalid YAML (nested too deeply)") from None


def load_yaml_file(path: str | Path) -> dict:
    return read_yaml_file(path)[1]


def read_yaml_file(path: str | Path) -> tuple[bytes, dict]:
    """The file read once: its bytes and the mapping parsed from those same bytes (a reload that
    fingerprints a file must fingerprint what it parsed, not a second read of a file being rewritten)."""
    p = Path(path)
    try:
        raw = p.read_bytes()
    except OSError as exc:
        raise ConfigError(f"{p}: cannot read: {exc.strerror or exc}") from exc
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{p}: <top>: not UTF-8 text ({exc.reason} at byte {exc.start})") from exc
    data = parse_yaml(text, str(p))
    if data is None:
        return raw, {}
    if not isinstance(data, dict):
        raise ConfigError(f"{p}: <top>: expected a mapping, got {type(data).__name__}")
    return raw, data


def check_regexes(patterns: tuple[str, ...], path: str, source: str) -> None:
    for i, pat in enumerate(patterns):
        try:
            re.compile(pat)
        except re.error as exc:
            raise ConfigError(f"{source}: {_join(path, i)}: not a valid regex ({exc})") from exc


def check_hostport(value: str | None, path: str, source: str) -> None:
    if value is None:
        return
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(f"{source}: {path}: expected HOST:PORT, got {value!r}")


def split_hostport(value: str) -> tuple[str, int]:
    """``host:port`` or ``[v6]:port`` (checked by ``check_hostport``) as (host, port)."""
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"expected HOST:PORT, got {value!r}")
    return host.strip("[]"), int(port)
