"""`fabricmon demo`: a simulated cluster, the real agents and aggregator, injected faults, a report."""
