"""slimdata: cost-aware slicing, SlimPack packing, step-time simulation and runtime hooks.

The library (this package) never imports torch.distributed or :mod:`slimdata.hooks`; the
solver and simulator are pure Python/numpy.
"""

from __future__ import annotations

from slimdata.errors import (
    ConfigError,
    InputError,
    OutputExistsError,
    PlanError,
    SlimdataError,
    TokenizerError,
)

__version__ = "0.1.0"

__all__ = [
    "ConfigError",
    "InputError",
    "OutputExistsError",
    "PlanError",
    "SlimdataError",
    "TokenizerError",
    "__version__",
]
