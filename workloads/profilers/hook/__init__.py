"""Holds the sitecustomize that cloudprof puts on a --command's PYTHONPATH (see torch_gpu)."""
