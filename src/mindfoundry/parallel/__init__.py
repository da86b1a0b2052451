"""Multi-dimensional parallelism, the framework-free half: the launch's layout, the memory/communication planner,
the launcher command lines and the tensor layouts of rank slices (the layout rules are config's).

Nothing in this package imports torch or mindspore; the engines apply a validated
:class:`~mindfoundry.config.parallel_config.Layout` to their models.
"""
