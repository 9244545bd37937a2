"""Runtime: the one background event loop, futures, deadlines, shutdown, fork safety."""
