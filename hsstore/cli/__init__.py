"""The `hsstore` command line: argument parsing and text rendering only."""
