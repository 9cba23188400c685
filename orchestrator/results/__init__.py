"""What came back: the results store, reports, plots, comparisons. Never imports the engine."""
