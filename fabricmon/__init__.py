"""fabricmon: fabric telemetry and fault localization for GPU training clusters."""

__version__ = "0.2.0"
