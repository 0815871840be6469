"""Interop: read and write the hidden-state caches of SpecForge, Model-Optimizer, speculators and EAGLE.

``hsstore import`` turns another tool's cache into a variant keyed by hsstore's content keys (so it lines
up with native builds of the same conversations); ``hsstore export`` writes a variant in a tool's own
layout; ``adapters`` hands hsstore samples to those tools' trainers; ``vocab`` builds EAGLE-3 draft
vocabularies. Nothing outside the CLI imports this package.
"""
