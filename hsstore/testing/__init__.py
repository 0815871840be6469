"""Factories shared by the tests and the benchmark scripts: samples, states, provenance, model shapes.

One copy of each, importable wherever hsstore is (the scripts run as ``python scripts/X.py`` with no
``sys.path`` edits). Nothing in the product imports this package; it imports only core and storage.
"""
