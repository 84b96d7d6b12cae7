"""Import the cluster topology from the fabric: ``ibnetdiscover`` (InfiniBand) and LLDP (RoCE).

Pure parsers (``ibnetdiscover``, ``lldp``, ``nodemap``), the naming rules (``naming``, with the
vendor knowledge as tables in ``defaults``), the fabric-to-topology builder (``build``), the
version-2 file writer (``render``), the summary and diff of loaded topologies (``report``) and a
writer of ibnetdiscover text for generated fabrics (``ibnetgen``).  File reading and the command
line live in ``cli``.  Contract: DESIGN.md "Topology from the fabric".
"""
