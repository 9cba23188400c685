"""The statistics behind every figure: spread, knee, the USL fit and the search maths.

Pure functions over plain numbers, no I/O and no imports from the other stages:
the planner, the engine's adaptive and search strategies and the reports all read
them from here, so data flows one way and one figure means the same everywhere.
"""
