"""What the report counts as a missing value, and a column read as numbers.

The trials table mixes the kinds a user's job can leave behind: a column pandas reads as
float64 holds NaN where a trial measured nothing, an object column holds None, a newer
column is absent from an older store. Every figure treats all three alike: missing, left
out of medians and maxima, shown as a dash.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd


def missing(value: Any) -> bool:
    """None or NaN: one cell as ``pd.isna`` sees it (without its cost per call)."""
    return value is None or (isinstance(value, float) and value != value)


def number(value: Any) -> float:
    """One cell as a float (``pd.to_numeric(errors="coerce")``): NaN for what is not one."""
    if isinstance(value, bool | int | float):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return math.nan
    if hasattr(value, "item"):  # a numpy scalar
        return number(value.item())
    return math.nan


def numeric(frame: pd.DataFrame, name: str) -> pd.Series:
    """A column as float64, NaN where missing or not a number; all NaN without the column
    (a store from before it was recorded)."""
    import pandas as pd

    if name not in frame.columns:
        return pd.Series(math.nan, index=frame.index, dtype=float)
    return pd.to_numeric(frame[name], errors="coerce").astype(float)

