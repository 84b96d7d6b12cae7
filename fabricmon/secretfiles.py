"""Secret files a config names (tokens, TLS keys and certificates): present, readable, not the example.

``check-config`` and the daemons' start share these checks, so a config that passes ``check-config``
does not stop streaming at start for a missing token or the deploy examples' placeholder.  Where a
CI lints configs without their secrets (they live in a vault or a Kubernetes Secret), ``check-config
--skip-secrets`` checks everything else.
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

from .configload import ConfigError

# What the deploy examples ship in place of a secret (deploy/kubernetes/base/token-secret.yaml:
# "CHANGE-ME"): refused, so an unedited example never runs with a known token.
PLACEHOLDER = re.compile(r"change[-_ ]?me|replace[-_ ]?me|placeholder", re.IGNORECASE)


def file_problem(path: str) -> str | None:
    """Why ``path`` cannot be read as a file; None when it can."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return "no such file"
    except OSError as exc:
        return f"cannot stat: {exc.strerror or exc}"
    if not stat.S_ISREG(st.st_mode):
        return "not a regular file"
    if not os.access(path, os.R_OK):
        return "not readable by this user"
    return None


def placeholder_problem(path: str) -> str | None:
    try:
        text = Path(path).read_text(errors="replace")
    except OSError:
        return None  # reported by file_problem
    if not text.strip():
        return "is empty"
    if PLACEHOLDER.search(text):
        return "holds the example placeholder secret; put a real token in it (e.g. openssl rand -hex 32)"
    return None


# Where systemd's LoadCredential= puts a unit's credentials (the shipped units' token_file before 0.2.0).
CREDENTIALS_DIR = "/run/credentials/"


def credential_hint(path: str) -> str:
    """Why a /run/credentials path is missing when checked by hand, and what to check instead."""
    if not path.startswith(CREDENTIALS_DIR) or os.environ.get("CREDENTIALS_DIRECTORY"):
        return ""
    unit = path[len(CREDENTIALS_DIR):].split("/", 1)[0] or "UNIT"
    return (f" ({CREDENTIALS_DIR}{unit}/ is made by systemd from a unit's LoadCredential= and exists only inside "
            f"the running unit, as a copy taken at start that a rotated token never reaches; the shipped units "
            f"since 0.2.0 read /etc/fabricmon/token in place: point the config there)")


def token_lines_problem(text: str) -> str | None:
    """Why a token file's text is not one token per line (blank lines ignored), or None: the aggregator
    refuses such a file at reload, and an agent must not reconnect presenting half of one."""
    tokens = [ln.strip() for ln in text.splitlines() if ln.strip()]
    for i, t in enumerate(tokens):
        if any(c.isspace() for c in t) or not t.isprintable():
            return f"token on non-blank line {i + 1} holds whitespace or control characters (one token per line)"
    return None if tokens else "is empty"


def check_token_file(path: str | None, field: str, source: str) -> None:
    """A token file: readable, not empty, not the placeholder (one line naming file and field)."""
    if not path:
        return
    problem = file_problem(path) or placeholder_problem(path)
    if problem:
        hint = credential_hint(path) if problem == "no such file" else ""
        raise ConfigError(f"{source}: {field}: {path}: {problem}{hint}")


def check_plain_file(path: str | None, field: str, source: str) -> None:
    """A certificate, key or CA bundle: readable (its contents are checked where it is loaded)."""
    if not path:
        return
    problem = file_problem(path)
    if problem:
        hint = credential_hint(path) if problem == "no such file" else ""
        raise ConfigError(f"{source}: {field}: {path}: {problem}{hint}")


def refuse_placeholder_secret(path: str | None, field: str, source: str) -> None:
    """At start: only the placeholder (a missing file is reported by the part that reads it)."""
    if not path:
        return
    problem = placeholder_problem(path)
    if problem and problem != "is empty":
        raise ConfigError(f"{source}: {field}: {path} {problem}")
