"""Precision debugging: tensor dumps through module hooks, overflow location, dump comparison, alignment.

Framework-free: the engines only hand numpy arrays to a :class:`~mindfoundry.debug.probe.Probe`.
"""
