"""Parse a topology file in a child process (a reload's, reload.py).

A 4,096-node file listed node by node is seconds of CPU in the YAML parser, which holds the GIL:
parsed in a thread of the aggregator it halved the detection thread's tick rate.  The child
parses and writes the ``Topology`` back pickled on stdout (our own child's output, nothing
else's, is unpickled); a ConfigError comes back as its one line on stderr, exit status 2.
"""

from __future__ import annotations

import pickle
import subprocess
import sys

from ..configload import ConfigError
from ..topology import Topology, load_topology


def load_apart(path: str, timeout: float = 300.0) -> Topology:
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
        return load_topology(path)
    topo = pickle.loads(done.stdout)
    if not isinstance(topo, Topology):
        raise ConfigError(f"{path}: <top>: the parser returned {type(topo).__name__}")
    return topo


def main(argv: list[str]) -> int:
    try:
        topo = load_topology(argv[0])
    except ConfigError as exc:
        print(str(exc), file=sys.stderr)
        return 2
    sys.stdout.buffer.write(pickle.dumps(topo, protocol=pickle.HIGHEST_PROTOCOL))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
