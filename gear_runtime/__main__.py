"""``python -m gear_runtime``: the ``gear-runtime`` command, for where its script is not on the
PATH (a venv not activated, ``pipx run``, Windows launchers)."""

import sys

from gear_runtime.cli.app import main

if __name__ == "__main__":  # imported (a test's import, a tool's scan), it runs nothing
    sys.exit(main())
