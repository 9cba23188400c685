"""Arrow arrays built from their buffers, so that the data plane never imports pandas.

``pa.array`` (and ``pa.Table.from_arrays`` given numpy arrays, which calls it)
asks pyarrow's pandas shim whether the input is a pandas object, and the shim
imports pandas to find out: 0.27 s and tens of MB at every trial runner's
start-up (benchmarks/bench_sweep.py, "runner before its clock"). Building
fixed-width arrays from their buffers asks nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def from_numpy(values: Any, typ: Any) -> Any:
    """A null-free Arrow array viewing (not copying) a contiguous numpy array of ``typ``."""
    import numpy as np
    import pyarrow as pa

    data = np.ascontiguousarray(values, dtype=_dtype(typ))
    return pa.Array.from_buffers(typ, len(data), [None, pa.py_buffer(data)], null_count=0)


def nullable(values: Sequence[Any], typ: Any) -> Any:
    """An Arrow array of ``typ`` from Python numbers, ``None`` as null."""
    import numpy as np
    import pyarrow as pa

    n = len(values)
    valid = np.fromiter((v is not None for v in values), dtype=bool, count=n)
    data = np.fromiter((0 if v is None else v for v in values), dtype=_dtype(typ), count=n)
    nulls = n - int(valid.sum())
    validity = pa.py_buffer(np.packbits(valid, bitorder="little")) if nulls else None
    return pa.Array.from_buffers(typ, n, [validity, pa.py_buffer(data)], null_count=nulls)


def _dtype(typ: Any) -> Any:
    import numpy as np
    import pyarrow as pa

    known = {pa.float64(): np.float64, pa.int64(): np.int64, pa.int32(): np.int32}
    if typ not in known:
        raise TypeError(f"no numpy type for Arrow {typ}")  # a programming error, not input
    return known[typ]
