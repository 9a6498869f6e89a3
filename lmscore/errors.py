"""Exception types of lmscore.

Every error a user can cause (a bad file, a bad plan, a bad knob) is raised as a
subclass of :class:`LmsError` whose message is one line naming the file, node or field
and the problem. The CLI prints that line and exits with status 2; anything else is a bug.
"""

from __future__ import annotations


class LmsError(Exception):
    """Base class of every user-facing error raised by lmscore."""


class GraphError(LmsError):
    """The input is not a usable graph (unreadable, corrupt, cyclic, dangling input...)."""


class PlanError(LmsError):
    """A swap plan is malformed or does not fit the graph it is applied to."""


class ConfigError(LmsError):
    """A knob, option or path given by the user is out of range or unusable."""


class RunError(LmsError):
    """TensorFlow could not run a graph for validation (and why)."""
