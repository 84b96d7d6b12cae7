"""Wait on a condition with a deadline instead of sleeping and hoping (tests never depend on timing)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

# What a predicate raises while the service it asks is not up yet.
NOT_UP_YET = (OSError, ValueError)  # urllib.error.URLError is an OSError


def wait_until(pred: Callable[[], Any], timeout: float = 10.0, what: str | None = None, *,
               interval: float = 0.01) -> Any:
    """Poll ``pred`` every ``interval`` s until it is truthy or ``timeout`` s pass.

    Returns its first truthy answer.  Without ``what`` the wait is a question: on timeout it returns
    the predicate's last (falsy) answer, for ``assert wait_until(...)`` and ``assert not wait_until(...)``.
    With ``what`` it is a requirement: errors the predicate raises meanwhile (``NOT_UP_YET``) count as
    "not yet", and a timeout raises ``TimeoutError`` naming ``what`` and the last error.
    """
    deadline = time.monotonic() + timeout
    last_exc: BaseException | None = None
    while True:
        if what is None:
            value = pred()
        else:
            try:
                value = pred()
            except NOT_UP_YET as exc:
                value, last_exc = None, exc
        if value:
            return value
        if time.monotonic() >= deadline:
            if what is None:
                return value
            raise TimeoutError(f"timed out after {timeout}s waiting for {what}"
                               + (f" (last error: {last_exc})" if last_exc else ""))
        time.sleep(interval)
