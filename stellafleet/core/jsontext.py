"""Strict JSON out: every document stella writes goes through here, a non-finite number as null."""

from __future__ import annotations

import json
import math
from typing import Any


def finite(value: Any) -> Any:
    """value with every non-finite float, at any depth, replaced by None."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: finite(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [finite(item) for item in value]
    return value


def dumps(value: Any, **kwargs: Any) -> str:
    return json.dumps(finite(value), allow_nan=False, **kwargs)
