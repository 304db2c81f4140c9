"""Gear specifications: parse and validate what GE users already write."""

from gear_runtime.spec.gearspec import DEFAULT_MAX_GEARS, MODES, GearSpec

__all__ = ["DEFAULT_MAX_GEARS", "MODES", "GearSpec"]
