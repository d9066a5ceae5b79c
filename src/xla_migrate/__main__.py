"""``xla-migrate`` and ``python -m xla_migrate``.

``--version`` is answered before the CLI framework and libcst are imported, so it costs almost nothing.
"""

from __future__ import annotations

import sys


def main() -> None:
    if sys.argv[1:] == ["--version"]:
        from . import __version__

        print(f"xla-migrate {__version__}")
        return
    from .cli import run

    run()


if __name__ == "__main__":
    main()
