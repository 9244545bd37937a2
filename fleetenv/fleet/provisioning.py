"""Creating and deleting instances with fleet-python, inside caps, retries and a budget.

``provision()`` is blocking and runs in the caller's thread (or a worker thread for the
async twins), never on the event-loop thread: a create can take minutes on real Fleet and
must not stall other episodes' MCP traffic.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from fleetenv.core.errors import (
    DeadlineExceeded,
    FleetEnvError,
    InstanceGoneError,
    ProvisioningError,
    TransientProvisioningError,
)
from fleetenv.core.redaction import register_secret
from fleetenv.core.retry import Backoff, Deadline, RetryPolicy
from fleetenv.core.types import Modality
from fleetenv.fleet.classify import is_gone, is_rate_limit, never_sent, provisioning_error
from fleetenv.fleet.deadlines import ProvisioningDeadlineExceeded, deadline_scope
from fleetenv.fleet.limits import Gate, KeyLimiter
from fleetenv.fleet.registry import (
    InstanceRegistry,
    LiveInstance,
    exiting,
    terminating,
    track,
)

if TYPE_CHECKING:  # pragma: no cover
    from fleet.client import SyncEnv

    from fleetenv.fleet.client import FleetClient

logger = logging.getLogger("fleetenv.provisioning")

#: Seconds one instance's delete may take at interpreter exit or after SIGTERM.
EXIT_DELETE_BUDGET_S = 2.0
#: The most one create's readiness poll may take (within the provisioning budget).
READY_TIMEOUT_S = 300.0

#: Image type fleet-python sends per modality (computer_use runs the "mcp" image).
IMAGE_TYPES: dict[Modality, str | None] = {Modality.TOOL_USE: None,
                                           Modality.COMPUTER_USE: "mcp",
                                           Modality.BROWSER_USE: None}


def new_run_tag() -> str:
    """A fresh tag for the instances of one session or run, so leftovers can be swept."""
    return f"fleetenv-{uuid.uuid4().hex[:12]}"


@dataclass
class ProvisionRequest:
    env_key: str
    env_version: str | None = None
    data_key: str | None = None
    data_version: str | None = None
    env_variables: dict[str, Any] | None = None
    modality: Modality = Modality.TOOL_USE
    ttl_seconds: int | None = None
    task_key: str | None = None
    run_tag: str | None = None
    """fleet-python's ``run_id`` for the instance; ``None``: the provisioner's tag."""
    region: str | None = None
    """Where Fleet should run the instance (``None``: Fleet's default). An unknown region
    is a ``PermanentProvisioningError`` that names the valid ones."""

    @property
    def env_spec(self) -> str:
        return f"{self.env_key}:{self.env_version}" if self.env_version else self.env_key

    @property
    def data_spec(self) -> str | None:
        if self.data_key and self.data_version:
            return f"{self.data_key}:{self.data_version}"
        return self.data_key


@dataclass
class Instance:
    """A running instance this process owns (it is in the registry until deleted)."""

    instance_id: str
    env_key: str
    root_url: str
    manager_url: str
    env: SyncEnv = field(repr=False)
    provision_seconds: float = 0.0
    attempts: int = 1
    deleted: bool = False
    holds_live_slot: bool = field(default=False, repr=False)
    run_tag: str = ""
    """The tag it was created under (``fleetenv sweep --tag`` finds it by that)."""


ProvisionListener = Callable[[str, dict[str, Any]], None]
"""Receives ("attempt", {...}) as each create is sent and ("retry", {...}) before each
pause; the env turns them into events."""


class Provisioner:
    """Creates instances with retries on typed transient errors, and deletes them.

    Built by a :class:`~fleetenv.Session`, with the session's pieces: its Fleet client,
    its registry, its caps and its retry policy, plus the per-key limiter it shares with
    every session that uses the same API key. Safe to share between threads.
    """

    def __init__(
        self,
        client: FleetClient,
        *,
        registry: InstanceRegistry,
        creating: Gate,
        live: Gate,
        key_limit: KeyLimiter,
        retry: RetryPolicy,
        run_tag: str,
        delete_timeout_s: float = 30.0,
    ) -> None:
        self.client = client
        self.registry = registry
        self.creating = creating
        self.live = live
        self.key_limit = key_limit
        self.retry = retry
        self.run_tag = run_tag
        self.delete_timeout_s = delete_timeout_s
        # Run tags under which a create failed in a way that may have created an instance
        # anyway (timeout, dropped connection, 5xx): only those are worth sweeping.
        self._unsure_tags: set[str] = set()
        # Instances whose delete failed after its retries: no episode owns them any more
        # (their live slot is free), and every sweep tries to delete them again.
        self._failed_deletes: dict[str, Instance] = {}
        self._unsure_lock = threading.Lock()
        #: False in a process-pool worker: its run tag is shared with sibling workers
        #: whose instances are alive, so only the runner (after the last rollout) may
        #: sweep the tag; the worker still deletes again, by id, what it failed to delete.
        self.sweeps_shared_tags = True
        self._forget_lock = threading.Lock()
        registry.add_sweeper(self.sweep)

    def provision(self, request: ProvisionRequest, *,
                  deadline: Deadline | None = None,
                  listener: ProvisionListener | None = None) -> Instance:
        """Create an instance, wait until it runs; register it.

        Raises ``PermanentProvisioningError`` at once for auth / unknown env or version,
        ``TransientProvisioningError`` when the budget ran out on retryable failures, and
        ``DeadlineExceeded`` when a cap slot did not free up in time.
        """
        deadline = deadline or self.retry.deadline()
        context: dict[str, Any] = {"task": request.task_key, "env": request.env_spec,
                   "fleet": self.client.base_url, "region": request.region}
        started = time.monotonic()
        if terminating():
            raise FleetEnvError("not creating an instance: this process received SIGTERM "
                                "or SIGHUP and is deleting its instances", **context)
        track(self.registry)
        self.live.acquire(deadline, **context)
        try:
            with self.creating.slot(deadline, **context):
                instance = self._create_with_retries(request, deadline, context, listener)
        except BaseException:
            self.live.release()
            raise
        instance.holds_live_slot = True  # released when the instance is deleted
        # The instance's services hold the runner token and may echo it (a tool error, a
        # verifier's output): resolved now (once per client, as the first manager call
        # would; soft on ungated Fleets), it is scrubbed from everything we write.
        register_secret(self.client.runner_tokens.token())
        instance.provision_seconds = time.monotonic() - started
        return instance

    def _create_with_retries(self, request: ProvisionRequest, deadline: Deadline,
                             context: dict[str, Any],
                             listener: ProvisionListener | None) -> Instance:
        attempts = 0

        def attempt() -> Instance:
            nonlocal attempts
            attempts += 1
            self.key_limit.wait(deadline, **context)
            if listener:
                listener("attempt", {"attempt": attempts})
            try:
                return self._create_once(request, deadline, attempts)
            except ProvisioningError:
                raise
            except Exception as exc:
                error = provisioning_error(exc, **context)
                # Fleet said "slow down" to the whole key (a create that may have made an
                # instance anyway was marked for the sweep in _create_once).
                if isinstance(error, TransientProvisioningError) and is_rate_limit(exc):
                    self.key_limit.pause(self.retry.backoff.delay(attempts - 1))
                raise error from exc

        def on_retry(failures: int, delay: float, exc: Exception) -> None:
            message = exc.message if isinstance(exc, FleetEnvError) else str(exc)
            logger.info("provisioning %s failed (%s); retry %d in %.1f s",
                        request.env_spec, type(exc.__cause__ or exc).__name__, failures, delay)
            if listener:
                listener("retry", {"attempt": failures, "delay_s": delay,
                                   "error_type": type(exc.__cause__ or exc).__name__,
                                   "error": message})

        def give_up(exc: Exception, failures: int) -> Exception:
            message = exc.message if isinstance(exc, FleetEnvError) else str(exc)
            return TransientProvisioningError(
                f"gave up after {failures} attempt(s) within the {deadline.seconds:.0f} s "
                f"provisioning budget; last error: {message}",
                hint="raise the provisioning budget, lower concurrency, or retry later",
                **context)

        return self.retry.call(attempt, deadline=deadline, on_retry=on_retry,
                               give_up=give_up)

    def _create_once(self, request: ProvisionRequest, deadline: Deadline,
                     attempt: int) -> Instance:
        ttl = request.ttl_seconds
        sdk = self.client.sdk
        run_tag = request.run_tag or self.run_tag
        budget = deadline.cap(900.0)
        left = deadline.remaining()
        try:
            # An overall deadline, not only per-read timeouts (fleetenv.fleet.deadlines);
            # retryable when the budget outlives this attempt.
            with deadline_scope(budget, what=f"creating an instance of {request.env_spec}",
                                error_cls=ProvisioningDeadlineExceeded,
                                retryable=left is None or budget < left,
                                hint="raise timeouts.provision, or retry later",
                                task=request.task_key, env=request.env_spec):
                env = sdk.make(
                    request.env_spec,
                    data_key=request.data_spec,
                    env_variables=request.env_variables or None,
                    image_type=IMAGE_TYPES.get(request.modality),
                    ttl_seconds=ttl,
                    run_id=run_tag,
                    region=request.region,
                    timeout=budget,
                )
        except BaseException as exc:
            # The server may have created the instance although we never got (or could
            # not read) its id: a timeout, a dropped connection, a 5xx, a reply that does
            # not parse, Ctrl-C or SIGTERM while the request was out. Remember the tag,
            # so every exit path sweeps it. Re-raised unchanged.
            if _may_have_created(exc):
                self._mark_unsure(run_tag)
            raise
        instance = Instance(
            instance_id=env.instance_id, env_key=request.env_spec, root_url="",
            manager_url="", env=env, attempts=attempt, run_tag=run_tag,
        )
        # From here on the instance exists: register it before anything else can fail.
        self.registry.add(LiveInstance(env.instance_id, request.env_spec,
                                       lambda: self.delete(instance)))
        try:
            # Not env.resources(): fleetenv never uses the SDK env's db()/state()/browser()
            # (see fleetenv.fleet.client.load_resources for code that does).
            env = self._wait_until_running(env, deadline, request)
        except BaseException:
            try:
                self.delete(instance)
            except Exception as exc:  # the sweeper has it now; keep the original error
                logger.warning("could not delete instance %s after its start failed: %s",
                               instance.instance_id, exc)
            raise
        instance.env = env
        instance.root_url = env.urls.root if env.urls else ""
        instance.manager_url = env.manager_url
        return instance

    def _wait_until_running(self, env: SyncEnv, deadline: Deadline,
                            request: ProvisionRequest) -> SyncEnv:
        """Poll with backoff until the instance runs (real Fleet may answer "pending")."""
        ready = Deadline(deadline.cap(READY_TIMEOUT_S))
        poll = Backoff(base=0.25, cap=5.0)
        attempt = 0
        while env.status != "running":
            if env.status in ("stopped", "error"):
                raise TransientProvisioningError(
                    f"instance {env.instance_id} went to status {env.status!r} while starting",
                    task=request.task_key, env=request.env_spec, instance=env.instance_id,
                )
            if ready.expired():
                raise DeadlineExceeded(
                    f"instance {env.instance_id} was not running after "
                    f"{ready.seconds:.0f} s (status {env.status!r})",
                    hint="check Fleet's status page, or retry later",
                    task=request.task_key, env=request.env_spec, instance=env.instance_id,
                )
            time.sleep(ready.cap(poll.delay(attempt)))  # bounded poll with backoff
            attempt += 1
            with deadline_scope(ready, what=f"polling instance {env.instance_id}",
                                error_cls=ProvisioningDeadlineExceeded,
                                hint="check Fleet's status page, or retry later",
                                task=request.task_key, env=request.env_spec,
                                instance=env.instance_id):
                env = self.client.sdk.instance(env.instance_id)
        return env

    def delete(self, instance: Instance) -> None:
        """Delete the instance (idempotent). An already-gone instance counts as deleted.

        Transient failures (5xx, 429, connection) are retried with the session's backoff
        inside ``delete_timeout_s``; a delete is idempotent, so a retry cannot hurt.
        """
        if instance.deleted:
            return
        context: dict[str, Any] = {"instance": instance.instance_id, "env": instance.env_key}
        tag = instance.run_tag or self.run_tag

        def attempt() -> None:
            try:
                self.client.sdk.delete(instance.instance_id)
            except Exception as exc:
                if is_gone(exc):
                    return
                cause = provisioning_error(exc, **context)
                raise InstanceGoneError(
                    f"could not delete instance {instance.instance_id}: {cause.message}",
                    hint=f"fleetenv deletes it again when the session closes or the "
                         f"process exits; if that fails too, run `fleetenv sweep --tag "
                         f"{tag}`, or its TTL reaps it",
                    retryable=cause.retryable, **context) from exc

        budget, attempts = self.delete_timeout_s, 4
        if exiting():  # at exit: one quick retry, bounded (see registry.exiting)
            budget, attempts = min(budget, EXIT_DELETE_BUDGET_S), 2
        try:
            with deadline_scope(budget,
                                what=f"deleting instance {instance.instance_id}",
                                retryable=True, hint=f"it is deleted again at the next "
                                f"sweep; or run `fleetenv sweep --tag {tag}`", **context):
                self.retry.with_budget(budget, max_attempts=attempts).call(attempt)
        except Exception:
            self._forget(instance, deleted=False)
            raise
        self._forget(instance)

    def _forget(self, instance: Instance, *, deleted: bool = True) -> None:
        """Drop the instance from the registry and give its live slot back: it is gone
        (``deleted``), or its delete failed after the retries, so no episode owns it any
        more and the next sweep (session close, interpreter exit, SIGTERM, a runner's
        end) deletes it again."""
        with self._forget_lock:  # two deletes may race (SIGTERM cleanup vs. close)
            if instance.deleted:
                return
            instance.deleted = deleted
            release, instance.holds_live_slot = instance.holds_live_slot, False
        with self._unsure_lock:
            if deleted:
                self._failed_deletes.pop(instance.instance_id, None)
            else:
                self._failed_deletes[instance.instance_id] = instance
        self.registry.discard(instance.instance_id)
        if release:
            self.live.release()

    def _mark_unsure(self, run_tag: str) -> None:
        with self._unsure_lock:
            self._unsure_tags.add(run_tag)

    def sweep_tag(self, run_tag: str, *, dry_run: bool = False) -> list[str]:
        """Delete every running instance tagged ``run_tag`` (a runner's cleanup after a
        cancelled run: it also reaches instances created by worker processes; and
        ``fleetenv sweep --tag``). ``dry_run``: only list them."""
        if dry_run:
            return [env.instance_id for env in
                    self.client.sdk.instances(status="running", run_id=run_tag)]
        deleted = self._delete_tagged(run_tag, skip=set())
        with self._unsure_lock:
            self._unsure_tags.discard(run_tag)  # nothing under it is left to sweep
            for instance_id in deleted:
                self._failed_deletes.pop(instance_id, None)
        return deleted

    def sweep(self, run_tag: str | None = None) -> list[str]:
        """Delete leftovers of creates that failed after possibly creating an instance.

        A dropped connection, a 5xx, an unreadable reply or an interrupt (Ctrl-C, SIGTERM)
        after the server created the instance leaves one in Fleet's list that no episode
        knows. Sweeps ``run_tag`` (or every tag such a failure happened under), skipping
        instances an episode still owns. Also deletes again, by id, the instances whose
        delete failed earlier. Does nothing, and sends nothing, when no such failure
        happened. Only sweep a tag when no create under it
        can still be in flight (a runner after its last episode, or interpreter exit).
        """
        # A sweep runs at close and at exit: one budget for all of it, so a control plane
        # that trickles its answers cannot hold the exit for a minute per request.
        with deadline_scope(self.delete_timeout_s, what="sweeping leftover instances",
                            retryable=True, fleet=self.client.base_url):
            return self._sweep(run_tag)

    def _sweep(self, run_tag: str | None) -> list[str]:
        swept = self._retry_failed_deletes(run_tag)
        with self._unsure_lock:
            tags = ({run_tag} & self._unsure_tags) if run_tag else set(self._unsure_tags)
            if not self.sweeps_shared_tags:
                tags.clear()  # siblings in other processes may still use the tag
        for tag in tags:
            swept += self._delete_tagged(tag, skip=set(self.registry.live_ids()))
            with self._unsure_lock:
                self._unsure_tags.discard(tag)
        if swept:
            logger.info("swept %d leftover instance(s): %s", len(swept), ", ".join(swept))
        return swept

    def _retry_failed_deletes(self, run_tag: str | None) -> list[str]:
        """One more delete for each instance whose delete failed earlier (by id: a tag
        may be shared with instances other processes still use)."""
        with self._unsure_lock:
            pending = [i for i in self._failed_deletes.values()
                       if run_tag is None or (i.run_tag or self.run_tag) == run_tag]
        deleted: list[str] = []
        for instance in pending:
            tag = instance.run_tag or self.run_tag
            if self._delete_once(instance.instance_id, f"; run `fleetenv sweep --tag {tag}`, "
                                 "or its TTL reaps it"):
                self._forget(instance)
                deleted.append(instance.instance_id)
        return deleted

    def _delete_tagged(self, run_tag: str, *, skip: set[str]) -> list[str]:
        deleted: list[str] = []
        for env in self.client.sdk.instances(status="running", run_id=run_tag):
            if env.instance_id in skip:
                continue  # owned by a running episode, which will delete it
            if self._delete_once(env.instance_id, ""):
                self.registry.discard(env.instance_id)
                deleted.append(env.instance_id)
        return deleted

    def _delete_once(self, instance_id: str, advice: str) -> bool:
        """One delete, for a sweep: True when the instance is gone (deleted now, or
        already), False after logging why not (``advice`` ends the warning)."""
        try:
            self.client.sdk.delete(instance_id)
        except Exception as exc:
            if not is_gone(exc):
                logger.warning("sweep could not delete instance %s: %s%s", instance_id, exc,
                               advice)
                return False
        return True


def _may_have_created(exc: BaseException) -> bool:
    """False only when the create provably made nothing: it never left this process,
    or the server refused it (a 4xx other than 408 timeout / 409 conflict)."""
    if never_sent(exc):
        return False
    from fleet import exceptions as fx

    status = getattr(exc, "status_code", None) if isinstance(exc, fx.FleetAPIError) else None
    return not (isinstance(status, int) and 400 <= status < 500 and status not in (408, 409))
