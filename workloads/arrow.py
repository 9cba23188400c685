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


def booleans(values: Sequence[Any]) -> Any:
    """An Arrow boolean array from Python truth values, ``None`` as null."""
    import numpy as np
    import pyarrow as pa

    n = len(values)
    valid = np.fromiter((v is not None for v in values), dtype=bool, count=n)
    bits = np.fromiter((bool(v) for v in values), dtype=bool, count=n)
    nulls = n - int(valid.sum())
    validity = pa.py_buffer(np.packbits(valid, bitorder="little")) if nulls else None
    return pa.Array.from_buffers(pa.bool_(), n, [validity, pa.py_buffer(
        np.packbits(bits, bitorder="little"))], null_count=nulls)


def strings(values: Sequence[str | None], typ: Any) -> Any:
    """An Arrow ``string`` or ``large_string`` array from Python strings, ``None`` as null."""
    import numpy as np
    import pyarrow as pa

    n = len(values)
    encoded = [b"" if v is None else v.encode("utf-8") for v in values]
    offsets = np.zeros(n + 1, dtype=np.int64 if typ == pa.large_string() else np.int32)
    np.cumsum([len(b) for b in encoded], out=offsets[1:])
    valid = np.fromiter((v is not None for v in values), dtype=bool, count=n)
    nulls = n - int(valid.sum())
    validity = pa.py_buffer(np.packbits(valid, bitorder="little")) if nulls else None
    return pa.Array.from_buffers(typ, n, [validity, pa.py_buffer(offsets),
                                          pa.py_buffer(b"".join(encoded))], null_count=nulls)


def _dtype(typ: Any) -> Any:
    import numpy as np
    import pyarrow as pa

    known = {pa.float64(): np.float64, pa.int64(): np.int64, pa.int32(): np.int32}
    if typ not in known:
        raise TypeError(f"no numpy type for Arrow {typ}")  # a programming error, not input
    return known[typ]
