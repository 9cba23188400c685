"""The ground floor: machine types and their prices, and the fetchers that refresh them.

``machines`` reads the shipped and the user's catalog files; ``pricing`` fetches
prices from the clouds' own APIs (through ``orchestrator.sdk``) or imports them.
Every stage above (spec, plan, providers, results, engine) reads the catalog;
the catalog imports none of them.
"""
