"""The switch side of the fabric, read in-band: every switch port's PMA counters and PortInfo state from
one node's HCA with the real infiniband-diags (DESIGN.md "The switch side of the fabric").

``parse`` (the tools' outputs) and ``fabric_map`` (the switch map) are pure; ``tools`` runs the commands
under a deadline; ``sweeper`` schedules the sweeps on a thread of its own; ``source`` serves the last
complete sweep to the agent's poll."""
