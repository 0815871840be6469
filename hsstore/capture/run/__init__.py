"""Processes and the capture loop: driver, worker, pipeline, hooks, signals, lineage."""
