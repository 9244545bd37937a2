"""The local Fleet's trace routes, its in-memory trace store, and a browsable trace page.

The write routes follow fleet-python 0.2.133 (``TraceJobRequest``, ``SessionIngestRequest``,
``Session.log``); the read routes and the page are the local Fleet's own (docs/traces.md,
"The local Fleet"). Rules kept here:

* a repeated ``X-Request-ID`` gets its first answer again and stores nothing, so a client
  that lost an answer and retries does not store a transcript twice;
* the page (``/traces``) takes a *view key*, an HMAC of the server token, because a
  browser cannot send a bearer header: it opens the pages and nothing else, and the token
  never appears in a URL. The pages escape everything, forbid scripts (CSP) and show only
  ``data:image/...`` images, so viewing a trace fetches nothing; like Fleet's viewer they
  show no images in ``user`` messages (a line says how many);
* the store is bounded by ``max_sessions`` and ``max_bytes`` (oldest sessions go first),
  and one request body by ``MAX_BODY_BYTES``.
"""

from __future__ import annotations

import hashlib
import hmac
import html
import itertools
import secrets
import time
from collections import OrderedDict
from typing import Any
from urllib.parse import quote

from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Route, Router
from starlette.types import Receive, Scope, Send

from fleetenv.local.instances import iso
from fleetenv.local.wire import BadBody, ControlPlaneError, guarded, header, json_body

#: Largest request body a trace route accepts (a transcript with screenshots inline).
MAX_BODY_BYTES = 64 * 1024 * 1024
#: Answers kept for repeated ``X-Request-ID``s.
_MAX_ANSWERS = 4096
_STATUSES = frozenset({"pending", "running", "completed", "failed", "cancelled"})
_MESSAGE_FIELDS = ("role", "content", "thinking", "tool_calls", "tool_call_id", "timestamp",
                   "tokens", "metadata")
_SESSION_FIELDS = ("model", "task_key", "job_id", "instance_id", "status", "metadata",
                   "started_at", "ended_at", "verifier_execution_id")


def view_key(token: str) -> str:
    """The key that opens the trace pages of the server whose API token is ``token``."""
    return hmac.new(token.encode(), b"fleetenv-local-traces-view", hashlib.sha256
                    ).hexdigest()[:32]


def page_url(base_url: str, token: str) -> str:
    """The browsable trace page of a local Fleet at ``base_url`` (``fleetenv serve``)."""
    return f"{base_url.rstrip('/')}/traces?key={view_key(token)}"


class TraceStore:
    """Trace jobs and their sessions, in memory; only the server's loop touches it."""

    def __init__(self, max_sessions: int = 10_000, max_bytes: int = 512 * 1024 * 1024) -> None:
        self.max_sessions = max_sessions
        self.max_bytes = max_bytes
        self._sizes: dict[str, int] = {}
        self.jobs: dict[str, dict[str, Any]] = {}
        self.sessions: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self._answers: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self._numbers = itertools.count(1)

    def create_job(self, name: str | None) -> dict[str, Any]:
        number = next(self._numbers)
        job_id = f"tj-{secrets.token_hex(6)}"
        job = {"job_id": job_id, "name": name or f"local-trace-job-{number}",
               "status": "active", "created_at": iso(time.time())}
        self.jobs[job_id] = job
        return dict(job)

    def job(self, job_id: str) -> dict[str, Any]:
        job = self.jobs.get(job_id)
        if job is None:
            raise ControlPlaneError(404, f"Trace job '{job_id}' not found; create one with "
                                    "POST /v1/traces/jobs")
        return job

    def session(self, session_id: str) -> dict[str, Any]:
        session = self.sessions.get(session_id)
        if session is None:
            raise ControlPlaneError(404, f"Session '{session_id}' not found; omit session_id "
                                    "to create a new session")
        return session

    def ingest(self, body: dict[str, Any], size: int = 0) -> dict[str, Any]:
        """Create or append to a session from a ``SessionIngestRequest`` body of
        ``size`` bytes."""
        messages = _messages(body.get("messages"))
        fields = _session_fields(body)
        if fields.get("job_id") is not None:
            self.job(str(fields["job_id"]))
        session_id = body.get("session_id")
        if session_id is not None:
            session = self.session(_text(session_id, "session_id"))
            created = False
        else:
            session = {"session_id": f"ts-{secrets.token_hex(8)}", "messages": [],
                       "created_at": iso(time.time())}
            created = True
        session["messages"].extend(messages)
        for name, value in fields.items():
            if value is not None:
                session[name] = value
        if created:
            self.sessions[session["session_id"]] = session
        sid = session["session_id"]
        self._sizes[sid] = self._sizes.get(sid, 0) + size
        while len(self.sessions) > 1 and (len(self.sessions) > self.max_sessions
                                          or sum(self._sizes.values()) > self.max_bytes):
            old, _ = self.sessions.popitem(last=False)
            self._sizes.pop(old, None)
        return {"success": True, "session_id": session["session_id"],
                "message_count": len(session["messages"]), "created_new_session": created}

    def log(self, body: dict[str, Any], size: int = 0) -> dict[str, Any]:
        """fleet-python's ``Session.log`` (history + response) or ``complete``/``fail``."""
        if "history" not in body and "response" not in body:  # complete() / fail()
            return self.ingest({**body, "messages": [], "_allow_empty": True}, size)
        history = body.get("history") or []
        if not isinstance(history, list):
            raise BadBody("history must be a list of messages")
        messages = [m if isinstance(m, dict) and "role" in m
                    else {"role": "assistant", "content": m} for m in history]
        response = body.get("response")
        if response is not None:
            messages.append({"role": "assistant", "content": response})
        fields = {k: body.get(k) for k in ("session_id", "job_id", "model", "task_key",
                                           "instance_id")}
        return self.ingest({**fields, "messages": messages, "_allow_empty": True}, size)

    def remembered(self, request_id: str | None) -> dict[str, Any] | None:
        return None if request_id is None else self._answers.get(request_id)

    def remember(self, request_id: str | None, answer: dict[str, Any]) -> None:
        if request_id is None:
            return
        self._answers[request_id] = answer
        while len(self._answers) > _MAX_ANSWERS:
            self._answers.popitem(last=False)

    def summary(self, session: dict[str, Any]) -> dict[str, Any]:
        """A session without its messages (for listings)."""
        out = {k: v for k, v in session.items() if k != "messages"}
        out["message_count"] = len(session["messages"])
        return out

    def job_sessions(self, job_id: str) -> list[dict[str, Any]]:
        return [s for s in self.sessions.values() if s.get("job_id") == job_id]


def _text(value: Any, name: str) -> str:
    if not isinstance(value, str) or not value:
        raise BadBody(f"{name} must be a non-empty string, not {value!r}")
    return value


def _messages(raw: Any) -> list[dict[str, Any]]:
    if not isinstance(raw, list):
        raise BadBody("messages must be a list of {role, content, ...} objects")
    out = []
    for index, message in enumerate(raw):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise BadBody(f"messages[{index}] must be an object with a string 'role'")
        out.append({k: message[k] for k in _MESSAGE_FIELDS if message.get(k) is not None})
    return out


def _session_fields(body: dict[str, Any]) -> dict[str, Any]:
    if not body.get("_allow_empty") and not body.get("messages"):
        raise BadBody("messages must hold at least one message (SessionIngestRequest)")
    fields = {name: body.get(name) for name in _SESSION_FIELDS}
    status = fields.get("status")
    if status is not None and status not in _STATUSES:
        raise BadBody(f"status must be one of {sorted(_STATUSES)}, not {status!r}")
    metadata = fields.get("metadata")
    if metadata is not None and not isinstance(metadata, dict):
        raise BadBody("metadata must be an object")
    return fields


# ----- control-plane routes --------------------------------------------------------------


class TraceRoutes:
    """The ``/v1`` trace routes over the server's store; ``control_plane.build_router``
    lists them."""

    def __init__(self, store: TraceStore) -> None:
        self.store = store

    def routes(self) -> list[Route]:
        return [
            Route("/v1/traces/jobs", guarded(self.create_job), methods=["POST"]),
            Route("/v1/traces/jobs", guarded(self.list_jobs), methods=["GET"]),
            Route("/v1/traces/jobs/{job_id}", guarded(self.get_job), methods=["GET"]),
            Route("/v1/traces/sessions/{session_id}", guarded(self.get_session),
                  methods=["GET"]),
            Route("/v1/traces/logs", guarded(self.log), methods=["POST"]),
            Route("/v1/sessions/ingest", guarded(self.ingest), methods=["POST"]),
        ]

    async def _idempotent(self, request: Request, build: Any) -> Response:
        """Answer a repeated ``X-Request-ID`` with its first answer; else build one."""
        request_id = header(request.scope, b"x-request-id")
        earlier = self.store.remembered(request_id)
        if earlier is not None:
            return JSONResponse(earlier)
        body = await _bounded_body(request)
        answer = build(body, len(await request.body()))  # starlette keeps the body read
        self.store.remember(request_id, answer)
        return JSONResponse(answer)

    async def create_job(self, request: Request) -> Response:
        def build(body: dict[str, Any], size: int) -> dict[str, Any]:
            name = body.get("name")
            if name is not None and not isinstance(name, str):
                raise BadBody(f"name must be a string or null, not {name!r}")
            return self.store.create_job(name)

        return await self._idempotent(request, build)

    async def ingest(self, request: Request) -> Response:
        return await self._idempotent(
            request, lambda body, size: self.store.ingest({**body, "_allow_empty": False}, size))

    async def log(self, request: Request) -> Response:
        return await self._idempotent(request, self.store.log)

    async def list_jobs(self, request: Request) -> Response:
        store = self.store
        return JSONResponse([
            {**job, "session_count": len(store.job_sessions(job["job_id"]))}
            for job in store.jobs.values()
        ])

    async def get_job(self, request: Request) -> Response:
        store = self.store
        job = store.job(request.path_params["job_id"])
        return JSONResponse({**job, "sessions": [
            store.summary(s) for s in store.job_sessions(job["job_id"])]})

    async def get_session(self, request: Request) -> Response:
        return JSONResponse(self.store.session(request.path_params["session_id"]))


async def _bounded_body(request: Request) -> dict[str, Any]:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        raise ControlPlaneError(413, f"trace body of {int(declared)} bytes is over the local "
                                f"Fleet's {MAX_BODY_BYTES} byte limit; cap inline images")
    return await json_body(request)


# ----- the browsable page ----------------------------------------------------------------

_CSP = "default-src 'none'; img-src data:; style-src 'unsafe-inline'"
_STYLE = """<style>
body{font-family:system-ui,sans-serif;margin:2em;max-width:70em}
table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:.3em .6em;text-align:left}
.msg{border-left:4px solid #888;margin:1em 0;padding:.2em 1em}
.user{border-color:#2a7}.assistant{border-color:#27c}.tool{border-color:#c82}
.system{border-color:#999}pre{white-space:pre-wrap;word-break:break-word}
img{max-width:100%;border:1px solid #ccc}.meta{color:#555;font-size:.9em}
</style>"""


class TracePages:
    """``/traces``: jobs; ``/traces/jobs/{id}``: sessions; ``/traces/sessions/{id}``."""

    def __init__(self, store: TraceStore, token: str) -> None:
        self.store = store
        self._view_key = view_key(token)
        self._router = Router(routes=[
            Route("/traces", self.jobs_page, methods=["GET"]),
            Route("/traces/", self.jobs_page, methods=["GET"]),
            Route("/traces/jobs/{job_id}", self.job_page, methods=["GET"]),
            Route("/traces/sessions/{session_id}", self.session_page, methods=["GET"]),
        ])

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = Request(scope)
        key = request.query_params.get("key", "")
        if not hmac.compare_digest(key.encode(), self._view_key.encode()):
            page = _page("Trace viewer", "<p>This page needs its view key: open the link "
                         "<code>fleetenv serve</code> printed (<code>/traces?key=...</code>)."
                         "</p>", status=401)
            await page(scope, receive, send)
            return
        await self._router(scope, receive, send)

    def _key(self) -> str:
        return quote(self._view_key)

    async def jobs_page(self, request: Request) -> Response:
        rows = "".join(
            f"<tr><td><a href=\"/traces/jobs/{quote(j['job_id'])}?key={self._key()}\">"
            f"{_e(j['name'])}</a></td><td>{_e(j['job_id'])}</td><td>{_e(j['created_at'])}"
            f"</td><td>{len(self.store.job_sessions(j['job_id']))}</td></tr>"
            for j in reversed(list(self.store.jobs.values())))
        body = ("<table><tr><th>job</th><th>id</th><th>created</th><th>sessions</th></tr>"
                f"{rows}</table>" if rows else "<p>No trace jobs yet.</p>")
        return _page("Trace jobs", body)

    async def job_page(self, request: Request) -> Response:
        try:
            job = self.store.job(request.path_params["job_id"])
        except ControlPlaneError as exc:
            return _page("Not found", f"<p>{_e(exc.detail)}</p>", status=404)
        rows = "".join(
            f"<tr><td><a href=\"/traces/sessions/{quote(s['session_id'])}?key={self._key()}"
            f"\">{_e(s.get('task_key') or s['session_id'])}</a></td><td>{_e(s.get('model'))}"
            f"</td><td>{_e(s.get('status'))}</td><td>{_e(_score(s))}</td>"
            f"<td>{len(s['messages'])}</td></tr>"
            for s in self.store.job_sessions(job["job_id"]))
        body = (f"<p><a href=\"/traces?key={self._key()}\">all jobs</a></p>"
                "<table><tr><th>task</th><th>model</th><th>status</th><th>score</th>"
                f"<th>messages</th></tr>{rows}</table>")
        return _page(f"Job {job['name']}", body)

    async def session_page(self, request: Request) -> Response:
        try:
            session = self.store.session(request.path_params["session_id"])
        except ControlPlaneError as exc:
            return _page("Not found", f"<p>{_e(exc.detail)}</p>", status=404)
        facts = "".join(
            f"<li>{_e(name)}: {_e(session.get(name))}</li>"
            for name in ("task_key", "model", "status", "instance_id",
                         "verifier_execution_id", "job_id"))
        back = (f"<a href=\"/traces/jobs/{quote(str(session.get('job_id') or ''))}"
                f"?key={self._key()}\">job</a>")
        messages = "".join(_message_html(m) for m in session["messages"])
        body = (f"<p>{back}</p><ul class=meta>{facts}<li>score: {_e(_score(session))}</li>"
                f"</ul>{messages}")
        return _page(f"Session {session.get('task_key') or session['session_id']}", body)


def _score(session: dict[str, Any]) -> Any:
    metadata = session.get("metadata") or {}
    return metadata.get("score") if isinstance(metadata, dict) else None


def _e(value: Any) -> str:
    return html.escape("" if value is None else str(value))


def _message_html(message: dict[str, Any]) -> str:
    role = str(message.get("role", "?"))
    css = role if role in ("user", "assistant", "tool", "system") else "system"
    parts = [f"<div class=\"msg {css}\"><p class=meta><b>{_e(role)}</b>"]
    if message.get("tool_call_id"):
        parts.append(f" (answers {_e(message['tool_call_id'])})")
    parts.append("</p>")
    parts.append(_content_html(message.get("content"), images=role != "user"))
    for call in message.get("tool_calls") or []:
        function = call.get("function", {}) if isinstance(call, dict) else {}
        parts.append(f"<p class=meta>calls <b>{_e(function.get('name'))}</b> "
                     f"({_e(call.get('id') if isinstance(call, dict) else '')})</p>"
                     f"<pre>{_e(function.get('arguments'))}</pre>")
    parts.append("</div>")
    return "".join(parts)


def _content_html(content: Any, *, images: bool = True) -> str:
    """A message's content; ``images=False`` (a user message): images are not shown, as
    Fleet's session viewer drops them, and a line says how many there were."""
    if content is None:
        return ""
    if isinstance(content, str):
        return f"<pre>{_e(content)}</pre>"
    if isinstance(content, list):
        out = []
        hidden = 0
        for part in content:
            if isinstance(part, dict) and part.get("type") == "text":
                out.append(f"<pre>{_e(part.get('text'))}</pre>")
            elif isinstance(part, dict) and part.get("type") == "image_url":
                image = part.get("image_url")  # {"url": ...} or the URL itself
                url = image.get("url", "") if isinstance(image, dict) else image
                if not images:
                    hidden += 1
                elif isinstance(url, str) and url.startswith("data:image/"):
                    out.append(f"<p><img alt=\"image\" src=\"{_e(url)}\"></p>")
                else:  # never fetched by the page: shown as text
                    out.append(f"<p class=meta>image at {_e(url)}</p>")
            else:
                out.append(f"<pre>{_e(part)}</pre>")
        if hidden:
            out.append(f"<p class=meta>{hidden} image(s) not shown: Fleet's session viewer "
                       "shows no images in user messages</p>")
        return "".join(out)
    return f"<pre>{_e(content)}</pre>"


def _page(title: str, body: str, status: int = 200) -> HTMLResponse:
    text = (f"<!doctype html><html><head><meta charset=utf-8><title>{_e(title)}</title>"
            f"{_STYLE}</head><body><h1>{_e(title)}</h1>{body}</body></html>")
    return HTMLResponse(text, status_code=status, headers={
        "Content-Security-Policy": _CSP, "X-Content-Type-Options": "nosniff",
        "Referrer-Policy": "no-referrer", "Cache-Control": "no-store"})
