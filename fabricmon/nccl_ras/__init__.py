"""NCCL's RAS subsystem, queried like its ``ncclras`` client does (NCCL >= 2.28.7 for JSON).

``status`` parses the JSON status document into typed values (pure); ``protocol`` holds the wire
lines of the client protocol (data); ``client`` is the bounded socket I/O.  Sources: NVIDIA/nccl
``src/ras/client.cc``, ``src/ras/client_support.cc``, ``src/ras/ras_internal.h`` and
``docs/userguide/source/troubleshooting/ras.rst`` (tests/fixtures/nccl/ras/README.md cites commits).
"""
