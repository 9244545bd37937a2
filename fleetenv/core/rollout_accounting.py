"""Every started rollout completes exactly once, with one reason (docs/events.md,
"Accounting"): the books are kept per ``rollout_id`` from every event on the bus.

A second ``RolloutCompleted`` for one rollout is a bug in fleetenv, but by default it is
logged, recorded as a violation and *dropped* rather than raised: it arrives from
``close()``, ``atexit`` or a signal handler, where an exception would abort a cleanup that
still has instances to delete, and the first completion (the one with the real outcome)
has already been delivered. Tests and the chaos suite use ``strict=True`` (raise) or check
``report().violations``.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from dataclasses import dataclass, field

from fleetenv.core.errors import EpisodeStateError
from fleetenv.core.events import Event, RolloutCompleted, RolloutStarted

__all__ = ["AccountingReport", "RolloutAccounting"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class AccountingReport:
    """Counts so far. ``completed`` counts rollouts, not completion events."""

    started: int
    completed: int
    by_reason: dict[str, int] = field(default_factory=dict)
    #: Rollouts started and not completed (yet).
    in_flight: tuple[str, ...] = ()
    #: One line per broken rule (duplicate start or completion, completion without start).
    violations: tuple[str, ...] = ()

    @property
    def balanced(self) -> bool:
        """Every started rollout completed once, and no rule was broken."""
        return not self.in_flight and not self.violations


class RolloutAccounting:
    """Keeps the per-rollout books; thread-safe. Memory: one entry per rollout seen."""

    def __init__(self, *, strict: bool = False) -> None:
        self.strict = strict
        self._lock = threading.Lock()
        self._started_total = 0
        self._open: set[str] = set()
        self._completed: dict[str, str] = {}
        self._violations: list[str] = []

    def keeps(self, event_type: type[Event]) -> bool:
        """Whether `observe` records events of ``event_type`` (starts and completions)."""
        return issubclass(event_type, RolloutStarted | RolloutCompleted)

    def observe(self, event: Event) -> bool:
        """Record ``event``; ``False`` means it breaks the rules and must not be delivered."""
        if isinstance(event, RolloutStarted):
            return self._observe_start(event)
        if isinstance(event, RolloutCompleted):
            return self._observe_completion(event)
        return True

    def _observe_start(self, event: RolloutStarted) -> bool:
        rollout = event.rollout_id
        with self._lock:
            seen = rollout in self._open or rollout in self._completed
            if not seen:
                self._open.add(rollout)
                self._started_total += 1
                return True
        self._violation(f"rollout {rollout} started twice", event)
        return False

    def _observe_completion(self, event: RolloutCompleted) -> bool:
        rollout = event.rollout_id
        with self._lock:
            first_reason = self._completed.get(rollout)
            if first_reason is None:
                self._completed[rollout] = event.reason
                unstarted = rollout not in self._open
                self._open.discard(rollout)
        if first_reason is not None:
            self._violation(f"rollout {rollout} completed twice "
                            f"({first_reason!r}, then {event.reason!r})", event)
            return False
        if unstarted:
            # Delivered anyway: it carries an outcome, and the start most likely went to
            # another bus. The violation makes the books unbalanced.
            self._violation(f"rollout {rollout} completed without being started", event)
        return True

    def _violation(self, message: str, event: Event) -> None:
        with self._lock:
            self._violations.append(message)
        if self.strict:
            raise EpisodeStateError(message, hint="this is a fleetenv bug; please report it",
                                    task=event.task_key, env=event.env_key,
                                    instance=event.instance_id)
        logger.error("event accounting: %s [task=%s env=%s]; this is a fleetenv bug",
                     message, event.task_key, event.env_key)

    def report(self) -> AccountingReport:
        with self._lock:
            return AccountingReport(
                started=self._started_total,
                completed=len(self._completed),
                by_reason=dict(Counter(self._completed.values())),
                in_flight=tuple(sorted(self._open)),
                violations=tuple(self._violations),
            )

    def check_balanced(self) -> None:
        """Raise ``EpisodeStateError`` unless every started rollout completed exactly once."""
        report = self.report()
        if report.balanced:
            return
        problems = list(report.violations)
        if report.in_flight:
            shown = ", ".join(report.in_flight[:5])
            more = f" and {len(report.in_flight) - 5} more" if len(report.in_flight) > 5 else ""
            problems.append(f"{len(report.in_flight)} rollout(s) never completed: {shown}{more}")
        raise EpisodeStateError("rollout accounting is unbalanced: " + "; ".join(problems),
                                hint="every RolloutStarted needs exactly one "
                                     "RolloutCompleted")
