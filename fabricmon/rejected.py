"""The one exception every validation boundary raises for an outside value it refuses.

``reason`` is a word from that boundary's fixed set (it becomes a self-metric label, so it never
carries the value itself); the message names the field and the problem for the log.
"""

from __future__ import annotations


class InputRejected(ValueError):
    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
