"""``xla-migrate verify``: run a migrated script on torch_xla and check it.

The package's API is :mod:`xla_migrate.verify.core`'s (``from xla_migrate import verify; verify.verify(...)``,
as before the package): ``core`` assesses and runs the check, ``run`` runs the scripts, ``paths`` gives each
its import path, ``losses`` compares the losses, ``report`` has the report, ``cli`` the command line; ``child``
and ``child_hooks`` are the loader copied into the checked script's process (never imported here).
"""

from .core import *  # noqa: F401,F403 (the API, as core's __all__ lists it)
from .core import __all__  # noqa: F401
