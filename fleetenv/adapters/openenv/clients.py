"""``FleetEnvClient`` and ``FleetMCPTools``: the original's two lower-level handles.

The orchestrator (an instance's manager API: reset, databases, deletion) and the agent's
tools (MCP list / call over one or two endpoints), on fleetenv's parts: the session's
provisioner, :class:`~fleetenv.fleet.manager.ManagerClient` and one
:class:`~fleetenv.mcp.router.ToolRouter` (one persistent session per endpoint, a call sent
once) instead of a session per operation and blind retries.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from operator import attrgetter
from typing import TYPE_CHECKING, Any

from fleetenv import runtime
from fleetenv.adapters.openenv.compat import DropInToolNotFoundError, env_aliases
from fleetenv.adapters.openenv.rendering import legacy_value
from fleetenv.core.errors import ConfigurationError, InvalidActionError, ToolNotFoundError
from fleetenv.core.tool_results import DEFAULT_MAX_TEXT_CHARS
from fleetenv.core.types import Modality
from fleetenv.fleet.session import Session
from fleetenv.mcp.router import Endpoint, ToolRouter

if TYPE_CHECKING:  # pragma: no cover
    from fleet import SyncEnv

    from fleetenv.adapters.openenv.types import (
        FleetObservation,
        FleetState,
        ListToolsAction,
        StepResult,
    )
    from fleetenv.env.fleet_env import FleetEnv
    from fleetenv.fleet.manager import ManagerClient
    from fleetenv.fleet.provisioning import Instance

__all__ = ["FleetEnvClient", "FleetMCPTools"]

#: fleet-python's credential headers, sent to MCP endpoints too (as ``FleetEnv`` does).
_CREDENTIAL_HEADERS = ("Authorization", "X-JWT-Token", "X-Team-ID")
#: The original's default bound of one tool call.
_CALL_DEADLINE_S = 90.0


class FleetMCPTools:
    """The agent's tools on an instance: list and call across ``mcp_urls``.

    The tools of every URL; a tool belongs to the first URL that lists it. A URL may be
    absent (404/405) when another serves tools; one that fails otherwise is an error
    (the first URL's, when it is absent too). ``call_deadline_s`` bounds each call
    (default: ``FLEET_CALL_TOOL_DEADLINE_S``, else 90 s, as in the original), which is
    sent once: a call that may have run is never retried.
    ``max_retries``, ``initial_wait`` and ``max_backoff`` are accepted for compatibility
    and unused (session setup is retried inside ``connect_timeout_s`` budgets; there is
    no fixed 8 s wait). Requests carry ``Authorization: Bearer <api_key>``, as in the
    original, or the given ``headers``.
    """

    def __init__(self, api_key: str | None, mcp_urls: Sequence[str], max_retries: int = 8,
                 initial_wait: float = 8.0, max_backoff: float = 5.0,
                 call_deadline_s: float | None = None, *, connect_timeout_s: float = 10.0,
                 max_text_chars: int = DEFAULT_MAX_TEXT_CHARS,
                 headers: Mapping[str, str] | None = None) -> None:
        if not mcp_urls:
            raise ConfigurationError("FleetMCPTools needs at least one MCP URL",
                                     hint="pass mcp_urls=(f'{root}mcp',)")
        if headers is None and api_key:
            headers = {"Authorization": f"Bearer {api_key}"}
        if call_deadline_s is None:
            call_deadline_s = env_aliases() or _CALL_DEADLINE_S
        self.mcp_urls = tuple(mcp_urls)
        self.call_deadline_s = call_deadline_s
        self.max_text_chars = max_text_chars
        self._router = ToolRouter(
            [Endpoint(url, required=index == 0, headers=headers)
             for index, url in enumerate(self.mcp_urls)],
            connect_timeout_s=connect_timeout_s, call_timeout_s=call_deadline_s)

    def __repr__(self) -> str:
        return f"FleetMCPTools({list(self.mcp_urls)!r})"

    @property
    def router(self) -> ToolRouter:
        """The fleetenv router underneath (typed tools and ``ToolResult``\\ s)."""
        return self._router

    async def list_tools(self) -> ListToolsAction:
        """Every tool, in OpenAI function format, in a ``ListToolsAction`` (as the
        original returned them)."""
        from fleetenv.adapters.openenv.types import ListToolsAction

        tools = await runtime.current().call_async(self._router.alist_tools)
        return ListToolsAction(tools=[tool.openai() for tool in tools])

    async def call_tool(self, name: str, args: dict[str, Any] | None = None) -> Any:
        """Call ``name`` once; the result as the original rendered it (a JSON object or
        list parsed, ``{"error": message}`` when the tool reported an error). An unknown
        tool raises ``ToolNotFoundError`` (also a ``ValueError``, as in the original); a
        call without an answer ``ToolCallError``."""
        try:
            result = await runtime.current().call_async(functools.partial(
                self._router.acall, name, args or {}, timeout_s=self.call_deadline_s),
                name=f"call {name}")
        except ToolNotFoundError as exc:
            context: dict[str, Any] = dict(exc.context)
            raise DropInToolNotFoundError(exc.message, hint=exc.hint, **context) from None
        return legacy_value(result.to_openai_content(self.max_text_chars),
                            result.error_message if result.is_error else None)

    def close(self) -> None:
        """Close the MCP sessions (idempotent)."""
        self._router.close()

    async def close_async(self) -> None:
        await runtime.current().call_async(self._router.aclose)


class DatabaseMethods:
    """The original's database methods, on ``_database()`` (a FleetEnv or a manager)."""

    def _database(self) -> FleetEnv | ManagerClient:
        raise NotImplementedError

    def describe_db(self, db_name: str = "seed") -> dict[str, Any]:
        """Tables and columns of the instance's ``seed`` (default) or ``current`` db."""
        return self._database().describe_db(db_name)

    def query_db(self, sql: str, args: list[Any] | None = None,
                 db_name: str = "seed") -> dict[str, Any]:
        """Read-only SQL on the instance's ``seed`` (default) or ``current`` db."""
        return self._database().query_db(sql, args, name=db_name)

    async def describe_db_async(self, db_name: str = "seed") -> dict[str, Any]:
        return await runtime.current().run_blocking(self.describe_db, db_name)

    async def query_db_async(self, sql: str, args: list[Any] | None = None,
                             db_name: str = "seed") -> dict[str, Any]:
        return await runtime.current().run_blocking(self.query_db, sql, args, db_name)


class FleetEnvClient(DatabaseMethods):
    """One provisioned instance: its manager API (reset, databases) and deletion.

    Build it with :meth:`from_fleet` / :meth:`from_fleet_async`. ``_fleet_env`` is the
    instance's fleet-python handle, as in the original (``.instance_id``, ``.urls.root``).
    """

    def __init__(self, session: Session, instance: Instance, *, owns_session: bool,
                 mcp_urls: tuple[str, ...] = ()) -> None:
        self._session = session
        self._instance = instance
        self._owns_session = owns_session
        self._mcp_urls = mcp_urls
        self.base_url = instance.manager_url or instance.root_url

    def __repr__(self) -> str:
        return f"FleetEnvClient(instance={self._instance.instance_id!r})"

    # ------------------------------------------------------------------ factories

    @classmethod
    def from_fleet(cls, api_key: str | None, env_key: str, data_key: str | None = None,
                   data_version: str | None = None, image_type: str | None = None,
                   region: str | None = None, ttl_seconds: int = 3600,
                   env_variables: dict[str, Any] | None = None, *,
                   env_version: str | None = None, base_url: str | None = None,
                   session: Session | None = None, **kwargs: Any
                   ) -> tuple[FleetEnvClient, FleetMCPTools]:
        """Provision an instance of ``env_key`` (``"key:version"`` or ``env_version=``);
        return the orchestrator and the tools. ``image_type="mcp"`` is a computer-use
        image (tools on ``{root}api/v1/mcp`` only). Without ``api_key``: ``FLEET_API_KEY``
        or the embedded local Fleet. ``kwargs`` go to :class:`FleetMCPTools`."""
        client = cls._provision(api_key, env_key, data_key, data_version, image_type,
                                region, ttl_seconds, env_variables, env_version, base_url,
                                session)
        return client, client._tools(api_key, kwargs)

    @classmethod
    async def from_fleet_async(cls, api_key: str | None, env_key: str,
                               data_key: str | None = None, data_version: str | None = None,
                               image_type: str | None = None, region: str | None = None,
                               ttl_seconds: int = 3600,
                               env_variables: dict[str, Any] | None = None, *,
                               skip_mcp: bool = False, env_version: str | None = None,
                               base_url: str | None = None, session: Session | None = None,
                               **kwargs: Any) -> tuple[FleetEnvClient, FleetMCPTools | None]:
        """``from_fleet`` without blocking the caller's loop; ``skip_mcp=True`` returns
        no tools (the original's browser-use path)."""
        client = await runtime.current().run_blocking(
            cls._provision, api_key, env_key, data_key, data_version, image_type, region,
            ttl_seconds, env_variables, env_version, base_url, session)
        return client, None if skip_mcp else client._tools(api_key, kwargs)

    @classmethod
    def _provision(cls, api_key: str | None, env_key: str, data_key: str | None,
                   data_version: str | None, image_type: str | None, region: str | None,
                   ttl_seconds: int, env_variables: dict[str, Any] | None,
                   env_version: str | None, base_url: str | None,
                   session: Session | None) -> FleetEnvClient:
        from fleetenv.fleet.provisioning import ProvisionRequest

        if not env_key:
            raise ConfigurationError("from_fleet() needs an env_key",
                                     hint="pass env_key='name' or 'name:version'")
        if env_version is None and ":" in env_key:
            env_key, env_version = env_key.split(":", 1)
        owns = session is None and (api_key is not None or base_url is not None)
        if session is None:
            session = Session(api_key=api_key, base_url=base_url) if owns else (
                Session.shared())
        modality = Modality.COMPUTER_USE if image_type == "mcp" else Modality.TOOL_USE
        request = ProvisionRequest(env_key=env_key, env_version=env_version,
                                   data_key=data_key, data_version=data_version,
                                   env_variables=dict(env_variables or {}),
                                   modality=modality, ttl_seconds=ttl_seconds,
                                   region=region)
        try:
            instance = session.provisioner.provision(request)
        except Exception:
            if owns:
                session.close()
            raise
        root = instance.root_url
        urls = ((f"{root}api/v1/mcp",) if modality is Modality.COMPUTER_USE
                else (f"{root}mcp", f"{root}api/v1/mcp"))
        return cls(session, instance, owns_session=owns, mcp_urls=urls)

    def _tools(self, api_key: str | None, options: dict[str, Any]) -> FleetMCPTools:
        options.setdefault("connect_timeout_s", self._session.config.timeouts.connect)
        if api_key is None:  # the session's own credentials (its key, or a login)
            sent = self._session.client.sdk.client.get_headers()
            options.setdefault("headers", {name: value for name, value in sent.items()
                                           if name in _CREDENTIAL_HEADERS})
        return FleetMCPTools(api_key, self._mcp_urls, **options)

    # ------------------------------------------------------------------ the original's handles

    @property
    def _fleet_env(self) -> SyncEnv:
        """The instance's fleet-python handle (``instance_id``, ``urls.root``, ``db()``)."""
        return self._instance.env

    instance_id = property(attrgetter("_instance.instance_id"))
    mcp_urls = property(attrgetter("_mcp_urls"))

    # ------------------------------------------------------------------ manager API

    def reset(self) -> StepResult[FleetObservation]:
        """Restore the instance's seed state (``POST /reset`` on its manager)."""
        from fleetenv.adapters.openenv.types import FleetObservation, StepResult

        body = self._database().reset(timeout_s=self._session.config.timeouts.reset)
        return StepResult(observation=FleetObservation(metadata=body), reward=None,
                          done=False)

    async def reset_async(self) -> StepResult[FleetObservation]:
        return await runtime.current().run_blocking(self.reset)

    def step(self, action: object) -> StepResult[FleetObservation]:
        """Refused, as tool actions were in the original: agent actions are MCP calls
        (:meth:`FleetMCPTools.call_tool`), and a Fleet manager has no ``/step``."""
        raise InvalidActionError(
            f"FleetEnvClient.step() got a {type(action).__name__}: agent actions are "
            "MCP-only", hint="call tools with FleetMCPTools.call_tool(name, args), or play "
            "whole episodes with FleetTaskEnv / fleetenv.FleetEnv")

    def state(self) -> FleetState:
        """The instance, as OpenEnv's ``State`` (``episode_id`` is the instance id)."""
        from fleetenv.adapters.openenv.types import FleetState

        instance = self._instance
        return FleetState(episode_id=instance.instance_id, step_count=0,
                          env_key=instance.env_key, instance_id=instance.instance_id,
                          root_url=instance.root_url, done=instance.deleted)

    def close(self) -> None:
        """Delete the instance (idempotent)."""
        try:
            self._session.provisioner.delete(self._instance)
        finally:
            if self._owns_session:
                self._session.close()

    async def close_async(self) -> None:
        await runtime.current().run_blocking(self.close)

    def _database(self) -> ManagerClient:
        return self._session.manager(self._instance)

