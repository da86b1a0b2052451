"""Multi-dimensional parallelism, the framework-free half: layout rules and the memory/communication planner.

Nothing in this package imports torch or mindspore; the engines apply a validated
:class:`~mindfoundry.parallel.layout.Layout` to their models.
"""
