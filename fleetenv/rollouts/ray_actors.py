"""The two Ray actors behind :class:`~fleetenv.rollouts.ray_runner.RayRunner`.

Plain classes, turned into Ray actors by the runner (``ray.remote(cls).options(...)``),
so importing this module needs neither Ray nor a cluster, and the classes can be tested
and type-checked like any other code.

* :class:`RolloutWorker` lives in one Ray worker process. It has its own fleetenv
  session (hence its own event-loop thread, connection pools and instance registry) and
  runs up to ``per_worker`` episodes at once, one per actor thread (a threaded actor with
  ``max_concurrency``), on :func:`~fleetenv.rollouts.jobs.run_job`: the very function the
  thread ``Runner`` runs, so a Ray rollout is the same episode as a local one.
* :class:`LiveInstanceCap` is a counting semaphore shared by everything that dispatches
  episodes (a cluster-wide cap on live instances: an episode holds at most one). Permits
  are named by their holder, so releasing is idempotent and the permits of a runner that
  went away can be returned in one call.
"""

from __future__ import annotations

import asyncio
import os

from fleetenv.core.event_bus import EventBus
from fleetenv.core.events import Event
from fleetenv.fleet.session import Session
from fleetenv.fleet.warm_pool import WarmPool
from fleetenv.rollouts.jobs import JobOutcome, RolloutJob, RolloutSettings, run_job
from fleetenv.rollouts.rollout import CancelToken

__all__ = ["LiveInstanceCap", "RolloutWorker"]


class RolloutWorker:
    """Runs rollouts in one Ray worker process on a session of its own.

    Every instance it creates carries the worker's own tag (``settings.run_tag``, the
    run's tag plus a worker suffix), so when this process dies the driver can delete
    exactly its instances at once, without touching the live ones of other workers.
    """

    def __init__(self, settings: RolloutSettings, warm_pool: int | None = None) -> None:
        self._settings = settings
        self._session = Session(settings.effective_config())
        self._cancel = CancelToken()
        #: Idle instances this worker keeps between episodes (``RayRunner(warm_pool=)``).
        self._pool = (WarmPool(self._session, max_instances=warm_pool)
                      if warm_pool else None)

    def run(self, job: RolloutJob) -> JobOutcome:
        """One rollout; its events come back with the result for the driver's bus."""
        collected: list[Event] = []
        bus = EventBus(sinks=[collected.append])
        # The worker's settings (its own tag and caps) replace the driver's.
        job = RolloutJob(task=job.task, policy=job.policy, settings=self._settings,
                         sample=job.sample)
        result = run_job(job, session=self._session, events=bus, cancel=self._cancel)
        return JobOutcome(result=result, events=tuple(collected))

    def cancel(self) -> int:
        """Stop every episode of this worker now (their envs close, which fails any tool
        call in flight); rollouts that arrive later come back cancelled at once."""
        self._cancel.cancel()
        return len(self._session.live_instance_ids())

    def shutdown(self) -> None:
        """Close the session: deletes the instances it still holds (warm ones too),
        closes its connection pools."""
        if self._pool is not None:
            self._pool.close()
        self._session.close()

    def pid(self) -> int:
        """The worker's process id (readiness probe, and for tests)."""
        return os.getpid()


class LiveInstanceCap:
    """A counting semaphore in a Ray actor (async, so waiting holders cost no thread).

    ``acquire`` waits at most ``timeout_s`` and says whether it got the permit, so a
    caller never blocks on a remote call longer than it chose to, and can notice its
    own cancellation between attempts.
    """

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError(f"the cap must be at least 1, got {limit}")
        self._limit = limit
        self._holders: set[str] = set()
        self._changed: asyncio.Condition | None = None

    def _condition(self) -> asyncio.Condition:
        # Created on the actor's own loop, at first use (not in __init__).
        if self._changed is None:
            self._changed = asyncio.Condition()
        return self._changed

    async def acquire(self, holder: str, timeout_s: float) -> bool:
        changed = self._condition()
        async with changed:
            if holder in self._holders:
                return True
            if len(self._holders) < self._limit:  # also answers a zero timeout
                self._holders.add(holder)
                return True
            if timeout_s <= 0:
                return False
            try:
                await asyncio.wait_for(
                    changed.wait_for(lambda: len(self._holders) < self._limit), timeout_s)
            except asyncio.TimeoutError:
                return False
            self._holders.add(holder)
            return True

    async def release(self, holder: str) -> None:
        changed = self._condition()
        async with changed:
            if holder in self._holders:
                self._holders.discard(holder)
                changed.notify_all()

    async def release_prefix(self, prefix: str) -> int:
        """Return every permit whose holder starts with ``prefix`` (a runner's leftovers)."""
        changed = self._condition()
        async with changed:
            mine = {h for h in self._holders if h.startswith(prefix)}
            self._holders -= mine
            if mine:
                changed.notify_all()
            return len(mine)

    async def held(self) -> int:
        return len(self._holders)

    async def limit(self) -> int:
        return self._limit
