"""The ``gear-runtime`` command line (one module per group of subcommands)."""

from gear_runtime.cli.app import main

__all__ = ["main"]
