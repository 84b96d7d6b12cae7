"""README.md and docs/ stay true: every file they link exists, and every command they show still parses.

A command is a code span or a line of a code block that runs fabricmon (``fabricmon ...``,
``.venv/bin/fabricmon ...``), a benchmark or a script (``python benchmarks/X.py``, ``python scripts/X.py``)
or a module (``python -m fabricmon.X``).  Each is run with ``--help`` after its subcommand words, and every
``--option`` the docs give it must be one its help lists.
"""

from __future__ import annotations

import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from support.paths import REPO

DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
# what runs it, then its arguments: (leading VAR=value words and "$ " allowed)
_COMMAND = re.compile(r"^(?:\$ )?(?:sudo )?(?:[A-Z_]+=\S+ )*"
                      r"((?:\.venv/bin/|/opt/fabricmon/bin/)?fabricmon"
                      r"|(?:\.venv/bin/)?python3? (?:-m fabricmon[\w.]*|benchmarks/\w+\.py|scripts/\w+\.py))(\s.*)?$")
_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _code(text: str) -> list[str]:
    """The lines of fenced code blocks (continuations joined) and the inline code spans."""
    out: list[str] = []
    for block in re.finditer(r"^```[^\n]*\n(.*?)^```", text, re.S | re.M):
        out.extend(block.group(1).replace("\\\n", " ").split("\n"))
    prose = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    out.extend(m.group(1) for m in re.finditer(r"`([^`\n]+)`", prose))
    return out


def commands(text: str) -> list[tuple[str, tuple[str, ...], tuple[str, ...]]]:
    """(program, subcommand words, --options) of every command in ``text``."""
    found = []
    for line in _code(text):
        for part in re.split(r"&&|\|\||;|\|", line.split(" #")[0]):
            m = _COMMAND.match(part.strip())
            if m is None:
                continue
            args = (m.group(2) or "").split()
            words: list[str] = []
            for a in args:
                if a.startswith("-"):
                    break
                words.append(a)
            options = tuple(sorted({a.split("=")[0] for a in args if a.startswith("--")}))
            found.append((m.group(1), tuple(words), options))
    return found


def _argv(program: str) -> list[str]:
    if program.endswith("fabricmon"):
        return [sys.executable, "-m", "fabricmon"]
    return [sys.executable, *program.split()[1:]]


def links(path: Path) -> list[str]:
    """Local files ``path`` links (web addresses and in-page anchors left out)."""
    return [t.split("#")[0] for t in _LINK.findall(path.read_text())
            if not t.startswith(("http://", "https://", "mailto:", "#"))]


def test_the_extraction_finds_commands_and_links(tmp_path: Path) -> None:
    text = ("Run `fabricmon demo --nodes 4` or:\n\n```sh\n.venv/bin/python benchmarks/bench_sim.py \\\n"
            "  --nodes 8 && fabricmon check-config FILE  # comment --not\n```\nnot `fabricmon`'s prose.\n")
    assert commands(text) == [(".venv/bin/python benchmarks/bench_sim.py", (), ("--nodes",)),
                              ("fabricmon", ("check-config", "FILE"), ()), ("fabricmon", ("demo",), ("--nodes",)),
                              ("fabricmon", (), ())]
    doc = tmp_path / "a.md"
    doc.write_text("[x](b.md#part) [y](https://example.org) [z](#top)")
    assert links(doc) == ["b.md"]


def test_every_linked_file_exists() -> None:
    missing = [f"{doc.relative_to(REPO)}: {target}" for doc in DOCS for target in links(doc)
               if target and not (doc.parent / target).exists()]
    assert len(DOCS) > 5 and missing == []


@pytest.mark.integration
def test_every_command_the_docs_show_parses() -> None:
    wanted: dict[tuple[str, tuple[str, ...]], set[str]] = {}
    for doc in DOCS:
        for program, words, options in commands(doc.read_text()):
            if program.endswith("fabricmon") and not words:
                continue  # the program's name in prose ("`fabricmon`"): no command
            wanted.setdefault((program, words), set()).update(options)
    assert len(wanted) > 10, wanted

    def check(key: tuple[str, tuple[str, ...]]) -> str | None:
        program, words = key
        res = subprocess.run([*_argv(program), *words, "--help"], capture_output=True, text=True, timeout=120,
                             cwd=REPO)
        if res.returncode != 0:
            return f"{program} {' '.join(words)} --help: exit {res.returncode}: {res.stderr.strip()[-300:]}"
        unknown = sorted(o for o in wanted[key] if o not in res.stdout)
        return f"{program} {' '.join(words)}: not in its --help: {unknown}" if unknown else None

    with ThreadPoolExecutor(max_workers=4) as pool:
        problems = [p for p in pool.map(check, sorted(wanted)) if p]
    assert problems == []
