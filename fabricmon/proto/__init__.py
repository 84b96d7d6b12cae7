"""The agent -> aggregator wire format (``fabricmon.proto``, package ``fabricmon.v1``).

The generated modules are checked in (see ``generate.py``); ``codec`` converts
between them and the in-process forms in ``fabricmon.batch``.
"""
