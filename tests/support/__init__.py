"""What tests share: paths, ports, waiting, and the rigs that start real services.

Test files import from here (``from support.waiting import wait_until``); no test file imports
another test file (tests/core/test_layout.py holds that).  ``tests/`` is on ``sys.path`` through
``pythonpath`` in pyproject.toml, so this works for ``pytest``, ``pytest tests/aggregator`` and a
single file alike.
"""
