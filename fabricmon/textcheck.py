"""Which strings from outside may become label values: printable, valid UTF-8, bounded.

A lone surrogate (JSON ``"\\ud800"``) cannot be encoded as UTF-8, so one in a
label value would fail the whole exposition; a control character breaks
line-oriented consumers.  ``str.isprintable`` is false for both (categories
Cs, Cc, Cf, Zl, Zp), so one C-speed call checks them.

Node and job names follow one rule wherever they enter (the agent's own name,
the aggregator's hello and rank intake, check-config, topology files):
``name_problem``.  A right-to-left override after ``node-000`` renders as
``node-000`` in a page while naming another node, so the bidi and zero-width
controls are named explicitly (they are category Cf, which ``isprintable``
already refuses; the table keeps the rule readable and testable on its own).
"""

from __future__ import annotations

MAX_NODE_NAME = 253  # a Kubernetes node name (DNS subdomain)
MAX_JOB_NAME = 128

# Invisible characters that change how a name reads: zero-width (U+200B-U+200F, which holds
# LRM/RLM), bidi embeddings and overrides (U+202A-U+202E), isolates (U+2066-U+2069), ALM (U+061C).
INVISIBLE_CONTROLS = frozenset(
    [chr(c) for c in range(0x200B, 0x2010)] + [chr(c) for c in range(0x202A, 0x202F)]
    + [chr(c) for c in range(0x2066, 0x206A)] + ["\u061c"])


def label_text_ok(value: object, max_len: int) -> bool:
    return isinstance(value, str) and 0 < len(value) <= max_len and value.isprintable()


# Component ids join node, device, port, GPU and NVLink names with "/" (DESIGN "Component ids"):
# a name holding one would spell another component, or an id the state file cannot parse back.
ID_SEPARATOR = "/"
# The series labels whose values become parts of component ids at the aggregator.
ID_LABELS = frozenset({"device", "port", "gpu", "link", "interface"})


def name_problem(value: object, max_len: int) -> str | None:
    """Why ``value`` is no valid node or job name (None when it is): one phrase for an error line."""
    if not isinstance(value, str):
        return "must be a string"
    if not value:
        return "must not be empty"
    if len(value) > max_len:
        return f"{len(value)} characters, at most {max_len}"
    return _glyph_problem(value)


def _glyph_problem(value: str) -> str | None:
    # Every invisible control is above U+007F: for ASCII (nearly every name) one C call decides.
    if not value.isascii():
        bad = next((c for c in value if c in INVISIBLE_CONTROLS), None)
        if bad is not None:
            return f"holds the invisible control U+{ord(bad):04X} (bidi or zero-width)"
    if not value.isprintable():
        c = next(c for c in value if not c.isprintable())
        return f"holds the non-printable character U+{ord(c):04X}"
    return None


def node_name_problem(value: object) -> str | None:
    why = name_problem(value, MAX_NODE_NAME)
    if why is None and ID_SEPARATOR in str(value):
        return f"holds {ID_SEPARATOR!r}, which separates the parts of component ids"
    return why


def id_part_problem(value: str, max_len: int) -> str | None:
    """Why a device, port, GPU, NVLink or interface name cannot be part of a component id (None when it
    can; empty is allowed: an IB port without a netdev has interface="")."""
    if len(value) > max_len:
        return f"{len(value)} characters, at most {max_len}"
    if ID_SEPARATOR in value:
        return f"holds {ID_SEPARATOR!r}, which separates the parts of component ids"
    return _glyph_problem(value)


def job_name_problem(value: object) -> str | None:
    return name_problem(value, MAX_JOB_NAME)


# Linux netdev names: at most IFNAMSIZ - 1 = 15 bytes, no "/", no whitespace, not "." or ".."
# (net/core/dev.c dev_valid_name).  A name is also a file name under --ethtool-dir.  Here, not in
# sources/, because the agent config checks sources.ethtool.interfaces with it too.
def valid_ifname(name: str) -> bool:
    return (0 < len(name) < 16 and name not in (".", "..") and name.isprintable()
            and not any(c in name for c in "/: \t") and name.isascii())
