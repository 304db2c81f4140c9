"""Gear specifications: parse and validate what GE users already write.

:class:`GearSpec` is the spec itself; the parsers behind its constructors are re-exported here
for callers that want them as functions (``hybrid=`` of :func:`spec_from_atc`, or
:func:`check_gears` on a gear list of their own).
"""

from gear_runtime.spec.gearspec import (
    GearSpec,
    spec_from_atc,
    spec_from_config,
    spec_from_ge_options,
    spec_to_atc,
    spec_to_config,
)
from gear_runtime.spec.parse import check_gears, parse_input_shape
from gear_runtime.spec.rules import DEFAULT_MAX_GEARS, MODES

__all__ = [
    "DEFAULT_MAX_GEARS",
    "MODES",
    "GearSpec",
    "check_gears",
    "parse_input_shape",
    "spec_from_atc",
    "spec_from_config",
    "spec_from_ge_options",
    "spec_to_atc",
    "spec_to_config",
]
