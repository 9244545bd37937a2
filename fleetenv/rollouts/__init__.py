"""Rollouts: policies, ``run_episode``, the executor-based ``Runner``, results, metrics.

The trainer-facing names are re-exported from ``fleetenv`` itself; import them from
there (``from fleetenv import Runner, run_episode``).
"""
