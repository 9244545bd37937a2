"""Adapters to other ecosystems (OpenEnv compat, Gymnasium, ...)."""
