"""The Scalene article's experiment as a cloudprof job: where does memory go as data grows?

A linear regression and a small MLP (scikit-learn) on synthetic data of
``--rows`` x ``--features``, in phases the report shows separately — import
(scikit-learn itself), load (read the data file), fit, predict, save (pickle
the model), exit (the interpreter's teardown) — so the share of memory taken by
I/O, fitting and inference can be read per data size.

It reports no units: each trial is one complete run (a fixed-work job), and
the report shows its time to complete, CPU, peak memory and cost per run.
``CLOUDPROF_WORKERS`` caps the BLAS/OpenMP threads scikit-learn uses. Each
phase's work is a function of its own (``load_data``, ``fit_model``,
``predict_rows``, ``save_model``), so a profile names them.
"""

from __future__ import annotations

import argparse
import os
import pickle
import tempfile
from pathlib import Path
from typing import Any

import numpy as np


def phase(name: str) -> None:
    print(f"cloudprof:phase {name}", flush=True)


def data_file(rows: int, features: int, seed: int = 0) -> Path:
    """The input as a user would have it: a file on disk, written once per size."""
    path = Path(tempfile.gettempdir()) / f"cloudprof-example-{rows}x{features}-{seed}.npz"
    if not path.exists():
        rng = np.random.default_rng(seed)
        x = rng.standard_normal((rows, features))
        y = x @ rng.standard_normal(features) + 0.1 * rng.standard_normal(rows)
        tmp = path.with_suffix(f".{os.getpid()}.tmp.npz")
        np.savez(tmp, x=x, y=y)
        os.replace(tmp, path)
    return path


def load_data(source: Path) -> tuple[np.ndarray, np.ndarray]:
    """Read the data file into memory (copies: the arrays outlive the file)."""
    with np.load(source) as data:
        return data["x"].copy(), data["y"].copy()


def fit_model(kind: str, x: np.ndarray, y: np.ndarray) -> Any:
    from sklearn.linear_model import LinearRegression
    from sklearn.neural_network import MLPRegressor

    model = (LinearRegression() if kind == "linear"
             else MLPRegressor(hidden_layer_sizes=(32,), max_iter=20, random_state=0))
    return model.fit(x, y)


def predict_rows(model: Any, x: np.ndarray) -> np.ndarray:
    return model.predict(x)


def save_model(model: Any) -> int:
    """Pickle the model as a job would ship it; its size in bytes."""
    with tempfile.NamedTemporaryFile(suffix=".pkl") as out:
        pickle.dump(model, out)
        return out.tell()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=100_000)
    p.add_argument("--features", type=int, default=50)
    p.add_argument("--model", choices=("linear", "mlp"), default="linear")
    args = p.parse_args()
    phase("import")
    # the import phase is scikit-learn's own cost (fit_model finds the modules loaded)
    import sklearn.linear_model
    import sklearn.neural_network  # noqa: F401
    from threadpoolctl import threadpool_limits

    workers = int(os.environ.get("CLOUDPROF_WORKERS", "1"))
    source = data_file(args.rows, args.features)
    with threadpool_limits(workers):
        phase("load")
        x, y = load_data(source)
        phase("fit")
        model = fit_model(args.model, x, y)
        phase("predict")
        predicted = predict_rows(model, x)
        phase("save")
        save_model(model)
        phase("exit")
    print(f"{args.model} rows={args.rows} features={args.features} "
          f"r2={1 - np.var(y - predicted) / np.var(y):.3f}")


if __name__ == "__main__":
    main()
