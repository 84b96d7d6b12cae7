"""Simulated cluster: scenario files, hardware state with fault injection, a synthetic training job,
node trees for the real agent (tree mode) or NodeBatches straight from memory (4,096 nodes).

Entry points: ``scenario.load_scenario`` / ``default_scenario`` / ``random_scenario``,
``runner.SimulatedCluster`` (demo, integration tests), ``inmemory.BatchBuilder`` (benchmarks).
"""
