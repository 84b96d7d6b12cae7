"""Acting on faults (DESIGN "Acting on faults"): drain or taint the node a node-local hardware fault is on,
with a dry run, a circuit breaker counted cluster-wide, a per-node cooldown, an exclude list and undo of
fabricmon's own actions only.  config (the section), policy (pure decisions), breaker (the persisted state),
actions (scontrol, the Kubernetes API, a webhook), executor (one job per node, retries), remediator (the
tick's stage), wiring (built from the config), metrics, cli (``fabricmon remediation reset``)."""
