"""The switch side of an Ethernet (RoCE) fabric over gNMI: Subscribe STREAM/SAMPLE to each configured
switch (DESIGN.md "The switch side of the fabric").

``profiles`` (which paths each profile subscribes and what each leaf or DB field is, as data) and
``decode`` (notifications to points) are pure; ``store`` keeps one switch's latest values, bounded;
``session`` is one switch's connection (TLS, credentials, reconnect with backoff, a stall deadline, a
message size bound); ``runner`` runs every switch's session on one asyncio thread; ``source`` serves the
stores to the agent's poll, which never waits on a switch."""
