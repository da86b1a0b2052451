"""Cleaning blocks in the style of datatrove: filters and transforms over a document stream.

See :mod:`.base` for the block interface, :mod:`.pipeline` for profiles and the order in which
blocks run, and docs/data-format.md for what each block removes and why.
"""
