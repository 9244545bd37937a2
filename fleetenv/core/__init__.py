"""Core types: tasks, configuration, errors, events. Plain data, no I/O."""
