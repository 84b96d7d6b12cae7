"""Which strings from outside may become label values: printable, valid UTF-8, bounded.

A lone surrogate (JSON ``"\\ud800"``) cannot be encoded as UTF-8, so one in a
label value would fail the whole exposition; a control character breaks
line-oriented consumers.  ``str.isprintable`` is false for both (categories
Cs, Cc, Cf, Zl, Zp), so one C-speed call checks them.
"""

from __future__ import annotations


def label_text_ok(value: object, max_len: int) -> bool:
    return isinstance(value, str) and 0 < len(value) <= max_len and value.isprintable()


# Linux netdev names: at most IFNAMSIZ - 1 = 15 bytes, no "/", no whitespace, not "." or ".."
# (net/core/dev.c dev_valid_name).  A name is also a file name under --ethtool-dir.  Here, not in
# sources/, because the agent config checks sources.ethtool.interfaces with it too.
def valid_ifname(name: str) -> bool:
    return (0 < len(name) < 16 and name not in (".", "..") and name.isprintable()
            and not any(c in name for c in "/: \t") and name.isascii())
