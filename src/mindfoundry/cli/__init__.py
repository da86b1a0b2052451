"""The command line: one module per command group; each parses its arguments, calls a workflow and prints."""
