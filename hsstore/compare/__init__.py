"""Comparing states: divergence statistics, diff, plots, live-model checks."""
