"""A stand-in for IPython when a notebook runs as a script (the real-programs suite): display does nothing."""

from . import display  # noqa: F401


def get_ipython():
    return None

version_info = (0, 0, 0)  # matplotlib asks when IPython is imported
__version__ = "0.0.0"
