"""The central half: ingest node deltas and rank timings, detect, localize, alert."""
