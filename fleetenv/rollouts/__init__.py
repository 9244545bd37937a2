"""Rollouts: policies, run_episode, the executor-based runner, results and metrics."""
