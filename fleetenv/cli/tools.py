"""``fleetenv tools``: list the tools an environment offers an agent.

Tools are only known once an instance runs, so this provisions one (on Fleet when
``FLEET_API_KEY`` is set, else on the embedded local Fleet), lists what the episode's agent
would see for the chosen modality, and deletes the instance again: always, also on an
error or Ctrl-C.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from fleetenv.mcp.tools import Tool


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("env", metavar="ENV_KEY[:VERSION]",
                        help="environment to inspect, e.g. helpdesk or helpdesk:v1")
    parser.add_argument("--modality", choices=("tool_use", "computer_use"), default="tool_use",
                        help="which tools: the app's tools (tool_use, default) or the "
                        "computer tool (computer_use)")
    parser.add_argument("--json", action="store_true",
                        help="print the tools in OpenAI function format as JSON")


def run(args: argparse.Namespace) -> int:
    from fleetenv.core.config import resolve_config
    from fleetenv.core.event_bus import EventBus
    from fleetenv.core.tasks import Task
    from fleetenv.env.fleet_env import FleetEnv

    task = Task(key=f"fleetenv-tools:{args.env}", prompt="(listing tools)", env_key=args.env,
                modality=args.modality)
    from fleetenv.cli.interrupts import RunInterrupted, quiet_interrupts

    config = resolve_config()
    env: FleetEnv | None = None
    # The context manager deletes the instance on every way out, Ctrl-C included; there is
    # no verifier and nothing to grade. No event sinks: this is not a rollout, and a
    # failure is reported once, as the command's error line.
    with quiet_interrupts(debug=args.debug):
        try:
            with FleetEnv(task, config=config, events=EventBus(sinks=[])) as env:
                env.reset()
                tools = list(env.tools)
                openai_tools = [t.openai() for t in tools]
                env.close(grade=False)
        except KeyboardInterrupt:
            instance = env.last_instance_id if env is not None else None
            done = (f"deleted instance {instance}" if instance
                    else "no instance was running")
            raise RunInterrupted(f"interrupted while listing the tools of {task.env_spec}; "
                                 f"{done}") from None
    if args.json:
        print(json.dumps(openai_tools, indent=2))
        return 0
    where = "the embedded local Fleet" if config.use_local else "Fleet"
    print(f"{len(tools)} tool(s) of {task.env_spec} ({args.modality}) on {where}:")
    for tool in tools:
        print(describe_tool(tool))
    return 0


def describe_tool(tool: Tool) -> str:
    """``name: first line of the description`` and one indented line per parameter."""
    summary = first_line(tool.description)
    lines = [f"{tool.name}: {summary}" if summary else tool.name]
    schema = tool.input_schema or {}
    required = set(schema.get("required") or [])
    for name, prop in (schema.get("properties") or {}).items():
        prop = prop if isinstance(prop, Mapping) else {}
        marker = "" if name in required else "?"
        text = first_line(str(prop.get("description") or ""))
        lines.append(f"    {name}{marker}: {type_of(prop)}" + (f"  {text}" if text else ""))
    return "\n".join(lines)


def first_line(text: str) -> str:
    return text.strip().splitlines()[0].strip() if text.strip() else ""


def type_of(prop: Mapping[str, Any]) -> str:
    """A short readable type for a JSON-schema property (enums and nullable kept)."""
    if "enum" in prop:
        return " | ".join(json.dumps(v) for v in prop["enum"])
    if "anyOf" in prop or "oneOf" in prop:
        options = prop.get("anyOf") or prop.get("oneOf") or []
        return " | ".join(type_of(o) for o in options if isinstance(o, Mapping)) or "any"
    if "$ref" in prop:
        return str(prop["$ref"]).rsplit("/", 1)[-1]
    kind = prop.get("type")
    if isinstance(kind, list):
        return " | ".join(str(k) for k in kind)
    if kind == "array" and isinstance(prop.get("items"), Mapping):
        return f"array of {type_of(prop['items'])}"
    return str(kind or "any")
