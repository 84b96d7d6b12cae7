"""The per-node agent: poller, exporter, stream client and rank-timing intake."""
