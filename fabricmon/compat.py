"""The few standard-library names fabricmon uses that Python 3.10 lacks (3.10 is DGX OS 6's and
Ubuntu 22.04's python3; pyproject's requires-python).  Import them from here, never from the
standard library directly: tests/core/test_python310.py holds the package to that."""

from __future__ import annotations

import sys
from datetime import timezone
from enum import Enum

# datetime.UTC is 3.11's alias of timezone.utc.
UTC = timezone.utc

if sys.version_info >= (3, 11):
    from enum import StrEnum
else:

    class StrEnum(str, Enum):
        """3.11's enum.StrEnum: members are str, and str() and format() give the value."""

        def __str__(self) -> str:
            return str(self.value)

        def __format__(self, spec: str) -> str:
            return format(str(self.value), spec)


__all__ = ["UTC", "StrEnum"]
