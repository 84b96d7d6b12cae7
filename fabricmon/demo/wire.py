"""The in-memory demo's wire: now ``proto.loopback.CodecWire`` (the simulator uses it too, and the
simulator does not import the demo); this name stays for the callers that import it from here."""

from __future__ import annotations

from ..proto.loopback import CodecWire

__all__ = ["CodecWire"]
