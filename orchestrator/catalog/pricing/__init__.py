"""Prices from the providers: refresh fetchers (GCP, AWS), the SkyPilot import, the cache.

Nothing here runs on a sweep's path: ``cloudprof catalog refresh`` writes the
user's catalog files and sweeps only read them (``catalog/machines.py``). The cloud
SDKs are imported inside the fetchers, so importing this package stays cheap.
"""
