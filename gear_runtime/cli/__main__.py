"""``python -m gear_runtime.cli``: the ``gear-runtime`` command."""

import sys

from gear_runtime.cli.app import main

sys.exit(main())
