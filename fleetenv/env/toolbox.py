"""The MCP tools of one ``FleetEnv``: which endpoints, which tools, and sending a call.

The toolbox owns the env's :class:`~fleetenv.mcp.router.ToolRouter` (one persistent MCP
session per endpoint) and decides what the agent is offered: the modality's tools, plus
the local ``submit_final_answer`` tool when the task wants an answer, and the local
context tools / meta-tools when the env enables them (``context_tools.py``,
``meta_tools.py``; with meta-tools, the MCP tools are reached through them and called by
name, not offered one by one). Its operations are plan steps (see
:mod:`fleetenv.runtime.plans`): the MCP work runs on fleetenv's loop thread, and the env
decides what a failure means for the episode.
"""

from __future__ import annotations

import contextlib
import copy
import difflib
import functools
import json
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from fleetenv.core.config import FleetConfig
from fleetenv.core.errors import (
    EpisodeStateError,
    FleetEnvError,
    ToolArgumentsError,
    ToolNotFoundError,
)
from fleetenv.core.events import ServerLog, ToolProgress, ToolsChanged
from fleetenv.core.tasks import Task
from fleetenv.core.types import Modality, ToolCall
from fleetenv.env.actions import SUBMIT_FINAL_ANSWER, SUBMIT_FINAL_ANSWER_TOOL
from fleetenv.env.context_tools import CONTEXT_TOOLS, context_tool_specs
from fleetenv.env.meta_tools import META_TOOLS, MetaTools, meta_tool_specs
from fleetenv.env.tool_call_parsing import render_tools
from fleetenv.mcp.arguments import ArgumentChecker
from fleetenv.mcp.notifications import ServerLogMessage, ToolProgressUpdate, ToolsListChanged
from fleetenv.mcp.tools import Tool
from fleetenv.runtime.plans import OnLoop, Plan

if TYPE_CHECKING:  # pragma: no cover
    from collections.abc import Mapping

    from fleetenv.core.retry import Deadline, RetryPolicy
    from fleetenv.core.tool_results import ToolResult
    from fleetenv.env.instance import InstanceLease
    from fleetenv.env.options import ResolvedOptions
    from fleetenv.mcp.notifications import Notification
    from fleetenv.mcp.router import ToolRouter

__all__ = ["Toolbox"]

#: The tool computer- and browser-use tasks act through (on the ``api/v1/mcp`` endpoint).
COMPUTER_TOOL = "computer"
#: Notifications kept between two steps; a server flooding logs loses the oldest.
_MAX_PENDING_NOTIFICATIONS = 1000
#: The local submit tool, as a ``Tool``, so its arguments are checked like any other's.
_SUBMIT_TOOL = Tool(name=SUBMIT_FINAL_ANSWER,
                    input_schema=SUBMIT_FINAL_ANSWER_TOOL["function"]["parameters"],
                    endpoint="local")


class Toolbox:
    """The tools one env offers its agent, and the MCP sessions behind them."""

    def __init__(self, task: Task, config: FleetConfig, options: ResolvedOptions) -> None:
        self.task = task
        self.context_tools = context_tools = options.context_tools
        self.meta_tools = meta_tools = options.meta_tools
        #: The meta-tools' index over the current MCP tools (meta-tools mode only).
        self.meta: MetaTools | None = None
        #: Tools answered by fleetenv itself, never sent to MCP.
        self._local: dict[str, Tool] = {
            t.name: t for t in [*(context_tool_specs() if context_tools else []),
                                *(meta_tool_specs() if meta_tools else [])]}
        self.config = config
        self.max_text_chars = options.max_text_chars
        self.tool_endpoints = options.tool_endpoints
        self.router: ToolRouter | None = None
        self.tools: list[Tool] = []
        self.openai_tools: list[dict[str, Any]] = []
        self._arguments = ArgumentChecker(options.check_arguments)
        #: What the servers said unasked (tool list changes, logs, progress), appended on
        #: the loop thread and taken by the env after each step (deque ops are atomic).
        self.notifications: deque[Notification] = deque(maxlen=_MAX_PENDING_NOTIFICATIONS)
        self._tools_version = 0
        #: The instance the open sessions talk to (None: not open).
        self.instance_id: str | None = None

    @property
    def is_open(self) -> bool:
        return self.router is not None

    def open_plan(self, root_url: str, *, instance_id: str | None,
                  headers: Mapping[str, str] | None = None,
                  retry: RetryPolicy | None = None,
                  browser_mcp: tuple[str, Mapping[str, str]] | None = None) -> Plan[None]:
        """Open the modality's endpoints on the instance at ``root_url`` and list tools.
        ``headers`` (credentials) go with every MCP request; ``retry`` paces and bounds
        the whole open (see ``InstanceLease.mcp_setup_retry``). ``browser_mcp``: the
        browser lease's MCP URL and its own credential (``browser_use``)."""
        from fleetenv.mcp.router import Endpoint, ToolRouter, endpoints_for

        browser_url = (self.task.metadata or {}).get("browser_mcp_url")
        endpoints: list[Endpoint] | None = None
        if self.task.modality is Modality.BROWSER_USE and not browser_url:
            if browser_mcp is not None:
                # The lease's endpoint, with the lease API's credential (not necessarily
                # the instance's: each endpoint carries its own).
                lease_url, lease_headers = browser_mcp
                endpoints = [Endpoint(lease_url, required=True,
                                      headers=dict(lease_headers) or None)]
            else:  # no lease: the instance's own computer endpoint serves the browser
                browser_url = f"{root_url}api/v1/mcp"
        router = ToolRouter(
            endpoints if endpoints is not None else
            endpoints_for(root_url, self.task.modality, browser_url, headers=headers,
                          union=self.tool_endpoints == "union"),
            connect_timeout_s=self.config.timeouts.connect,
            call_timeout_s=self.config.timeouts.call,
            read_timeout_s=self.config.timeouts.read,
            retry=retry,
            on_notification=self.notifications.append,
        )
        self.router = router  # before opening: close must find it if we are cancelled
        try:
            yield OnLoop(router.aopen)
            self._offer(router.tools, instance_id)
            self._tools_version = router.tools_version
            self.instance_id = instance_id
        except Exception:
            # Nothing of a failed open stays cached: the next reset() opens afresh.
            self.router, self.tools, self.openai_tools = None, [], []
            # The open already failed: that error is the one to report, not the close's.
            with contextlib.suppress(FleetEnvError):
                yield OnLoop(router.aclose)
            raise

    def attach_plan(self, lease: InstanceLease, deadline: Deadline) -> Plan[None]:
        """Sessions to the lease's instance for a new episode: kept open across episodes
        (and listed again if a server said its tools changed), or opened, after closing
        those of an instance that was replaced (they, and its lease's, are gone)."""
        if self.is_open and self.instance_id != lease.instance_id:
            yield from self.close_plan()
        if self.is_open:
            yield from self.refresh_plan(lease.instance_id)
            return
        instance = lease.require()
        yield from self.open_plan(instance.root_url, instance_id=instance.instance_id,
                                  headers=lease.mcp_headers(),
                                  retry=lease.mcp_setup_retry(deadline),
                                  browser_mcp=lease.browser_mcp())

    def _offer(self, tools: list[Tool], instance_id: str | None) -> None:
        """Keep the tools this task's modality acts through; fail if there are none."""
        if self.task.modality is Modality.TOOL_USE:
            kept = [t for t in tools if t.name != COMPUTER_TOOL]
        else:
            kept = [t for t in tools if t.name == COMPUTER_TOOL]
            if not kept:
                raise ToolNotFoundError(
                    f"a {self.task.modality} task needs the {COMPUTER_TOOL!r} tool, but the "
                    f"instance offers only {sorted(t.name for t in tools)}",
                    task=self.task.key, instance=instance_id)
        if not kept:
            raise ToolNotFoundError("the instance offers no tools for this task",
                                    task=self.task.key, instance=instance_id)
        self.tools = kept
        if self.meta_tools:
            self.meta = MetaTools(kept)
            self.openai_tools = copy.deepcopy(META_TOOLS)  # callers may edit theirs
        else:
            self.openai_tools = [t.openai() for t in kept]
        if self.context_tools:
            self.openai_tools.extend(copy.deepcopy(CONTEXT_TOOLS))
        if self.task.modality is Modality.TOOL_USE and self.task.needs_final_answer:
            self.openai_tools.append(SUBMIT_FINAL_ANSWER_TOOL)

    def is_local(self, name: str) -> bool:
        """True for a context tool or meta-tool this env answers itself."""
        return name in self._local

    def refresh_plan(self, instance_id: str | None) -> Plan[bool]:
        """List again the servers that said their tools changed, and offer the new list
        (True when the offer was rebuilt). Cheap when nothing changed: no request."""
        router = self.router
        if router is None or router.tools_version == self._tools_version:
            return False
        version = router.tools_version  # a change after this is seen next time
        tools: list[Tool] = yield OnLoop(router.arefresh_tools)
        self._offer(tools, instance_id)
        self._tools_version = version
        return True

    def screenshot_plan(self) -> Plan[tuple[list[dict[str, Any]], str | None]]:
        """The first screenshot of a computer/browser task, as chat content, and the error
        if it failed (a failed screenshot is shown to the agent, not raised)."""
        router = self._require_router()
        try:
            result: ToolResult = yield OnLoop(
                functools.partial(router.acall, COMPUTER_TOOL, {"action": "screenshot"},
                                  timeout_s=self.config.timeouts.call),
                name=f"call {COMPUTER_TOOL}")
        except FleetEnvError as exc:
            return [{"type": "text", "text": f"(initial screenshot failed: {exc})"}], str(exc)
        return result.to_openai_content(self.max_text_chars), result.error_message

    def check(self, call: ToolCall) -> dict[str, Any]:
        """The call's decoded arguments, exactly as the agent wrote them, once they fit.

        Raises ``ToolArgumentsError`` for arguments that are not a JSON object or do not
        fit the tool's input schema (see :mod:`fleetenv.mcp.arguments`), and
        ``ToolNotFoundError`` (with suggestions) for a tool the agent was not offered.
        Nothing is sent in either case.
        """
        arguments = call.decoded_arguments()
        tool = self._offered(call.name)
        if tool is None:
            names = [t["function"]["name"] for t in self.openai_tools]
            known = [*names, *(t.name for t in self.tools)] if self.meta_tools else names
            close = difflib.get_close_matches(call.name, known, n=3, cutoff=0.5)
            suggestion = f" Did you mean {', '.join(map(repr, close))}?" if close else ""
            available = ("Use search_tools to find the tools" if self.meta_tools
                         else f"Available: {', '.join(names)}")
            raise ToolNotFoundError(
                f"unknown tool {call.name!r}.{suggestion} {available}",
                tool=call.name, task=self.task.key)
        self._arguments.check(tool, arguments)
        if tool is _SUBMIT_TOOL:  # a usable answer would have been a FinalAnswer already
            raise ToolArgumentsError(
                f"{SUBMIT_FINAL_ANSWER}: missing required argument 'answer' (string)",
                hint='call it as submit_final_answer({"answer": "..."})', tool=call.name)
        return arguments

    def _offered(self, name: str) -> Tool | None:
        """The offered tool called ``name`` (read from the current list every time, so a
        refreshed listing is never out of step with what is checked)."""
        local = self._local.get(name)  # an env's own tools win over a same-named MCP tool
        if local is not None:
            return local
        for tool in self.tools:
            if tool.name == name:
                return tool
        if name == SUBMIT_FINAL_ANSWER and SUBMIT_FINAL_ANSWER_TOOL in self.openai_tools:
            return _SUBMIT_TOOL
        return None

    def call_plan(self, name: str, arguments: dict[str, Any],
                  timeout_s: float) -> Plan[ToolResult]:
        """Send one call (never retried once it may have run; see ``fleetenv.mcp``): its one
        deadline, ``timeout_s``, is enforced on the loop by the MCP connection."""
        router = self._require_router()
        result: ToolResult = yield OnLoop(
            functools.partial(router.acall, name, arguments, timeout_s=timeout_s),
            name=f"call {name}")
        return result

    def prompt(self, format: str) -> str:
        """The offered tools rendered for a chat template (see ``render_tools``)."""
        if not self.openai_tools:
            raise EpisodeStateError("tools_prompt() has no tools to render yet",
                                    hint="call reset() first: it lists the tools",
                                    task=self.task.key)
        return render_tools(self.openai_tools, format)

    def listing(self) -> str:
        """The offered tools as text (OpenEnv's list-tools action)."""
        return "\n".join(f"- {t['function']['name']}: {t['function'].get('description', '')}"
                         for t in self.openai_tools)

    def report_notifications(self, emit: Callable[..., None]) -> None:
        """Turn what the MCP servers said unasked since the last step into events (in the
        caller's thread: sinks never run on the loop thread)."""
        pending = self.notifications
        while pending:
            note = pending.popleft()
            if isinstance(note, ToolsListChanged):
                emit(ToolsChanged, endpoint=note.endpoint, tool_count=len(self.tools))
            elif isinstance(note, ServerLogMessage):
                data = note.data if isinstance(note.data, str) else json.dumps(
                    note.data, default=str, ensure_ascii=False)
                emit(ServerLog, endpoint=note.endpoint, severity=note.level, message=data,
                     logger_name=note.logger)
            elif isinstance(note, ToolProgressUpdate):
                emit(ToolProgress, tool_name=note.tool, progress=note.progress,
                     total=note.total, message=note.message)

    def close_plan(self) -> Plan[None]:
        """End the MCP sessions (idempotent)."""
        router, self.router = self.router, None
        self.instance_id = None
        if router is not None:
            yield OnLoop(router.aclose)

    def _require_router(self) -> ToolRouter:
        if self.router is None:
            raise EpisodeStateError("the MCP tools are not open", hint="call reset() first",
                                    task=self.task.key)
        return self.router
