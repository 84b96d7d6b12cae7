"""Parse a topology file in a child process (a reload's, reload.py).

A 4,096-node file listed node by node is seconds of CPU in the YAML parser, which holds the GIL:
parsed in a thread of the aggregator it halved the detection thread's tick rate.  The child
reads the file once and writes back, pickled on stdout, the SHA-256 of the bytes it read and the
``Topology`` parsed from those same bytes (our own child's output, nothing else's, is unpickled):
a file rewritten while a reload runs is then never fingerprinted as one version and run as
another.  A ConfigError comes back as its one line on stderr, exit status 2.
"""

from __future__ import annotations

import hashlib
import pickle
import subprocess
import sys

from ..configload import ConfigError, read_yaml_file
from ..topology import Topology, topology_from_mapping


def read_topology(path: str) -> tuple[str, Topology]:
    """(SHA-256 of the bytes read, the topology parsed from them): one read of the file."""
    raw, data = read_yaml_file(path)
    return hashlib.sha256(raw).hexdigest(), topology_from_mapping(data, path)


def load_apart(path: str, timeout: float = 300.0) -> tuple[str, Topology]:
    """``read_topology`` in a child process."""
    try:
        done = subprocess.run([sys.executable, "-m", __name__, path], capture_output=True, timeout=timeout,
                              check=False)
    except subprocess.TimeoutExpired:
        raise ConfigError(f"{path}: <top>: not parsed within {timeout:.0f} s") from None
    if done.returncode == 2:
        lines = done.stderr.decode(errors="replace").strip().splitlines()
        raise ConfigError(lines[-1] if lines else f"{path}: <top>: could not be parsed")
    if done.returncode != 0:
        # the child could not run (no interpreter, no memory): parse here rather than not at all
        return read_topology(path)
    got = pickle.loads(done.stdout)
    if not (isinstance(got, tuple) and len(got) == 2 and isinstance(got[0], str) and isinstance(got[1], Topology)):
        raise ConfigError(f"{path}: <top>: the parser returned {type(got).__name__}")
    return got


def main(argv: list[str]) -> int:
    try:
        got = read_topology(argv[0])
    except ConfigError as exc:
        print(str(exc), file=sys.stderr)
        return 2
    sys.stdout.buffer.write(pickle.dumps(got, protocol=pickle.HIGHEST_PROTOCOL))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
