"""Wait on a condition with a deadline instead of sleeping and hoping (tests never depend on timing)."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_until(pred: Callable[[], object], timeout: float = 10.0) -> bool:
    """Poll ``pred`` every 10 ms until it is truthy or ``timeout`` seconds pass; its last answer."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.01)
    return bool(pred())
