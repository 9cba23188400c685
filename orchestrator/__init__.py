"""The control plane: CLI, catalog, planner, providers, sweep engine, results and reports."""

__version__ = "0.1.0"
