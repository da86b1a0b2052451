"""One self-contained HTML report of a run (or two runs overlaid): `mindfoundry report RUN_DIR`."""
