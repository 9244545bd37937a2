"""A scripted OpenAI-compatible chat-completions server for the verifiers recipe test.

It plays each bundled task's reference solution: verifiers' OpenEnv env sends the
observation as a JSON user message, so the model reads the task key from the first one
and answers with the next action of the reference solution (one per assistant turn),
then a final text turn. Real HTTP on loopback (stdlib ``http.server``), so verifiers'
own OpenAI client makes real requests.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

MODEL = "scripted-reference"


class ScriptedModel:
    """``solutions``: task key -> the actions to send, in order."""

    def __init__(self, solutions: Mapping[str, Sequence[dict[str, Any]]]) -> None:
        self.solutions = solutions
        self.requests: list[dict[str, Any]] = []
        handler = self._handler()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}/v1"

    def __enter__(self) -> ScriptedModel:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(10)

    def reply(self, body: dict[str, Any]) -> str:
        messages = body.get("messages") or []
        users = [m for m in messages if m.get("role") == "user"]
        turns = sum(1 for m in messages if m.get("role") == "assistant")
        task_key = _task_key(users[0]) if users else None
        actions = self.solutions.get(task_key or "", [])
        if turns < len(actions):
            return json.dumps(actions[turns])
        return json.dumps({"type": "turn", "text": "Done."})

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        model = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:  # quiet
                pass

            def do_GET(self) -> None:
                if self.path.rstrip("/").endswith("/models"):
                    self._send({"object": "list", "data": [{"id": MODEL, "object": "model"}]})
                else:
                    self._send({"error": {"message": f"no route {self.path}"}}, 404)

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                model.requests.append(body)
                if not self.path.rstrip("/").endswith("/chat/completions"):
                    self._send({"error": {"message": f"no route {self.path}"}}, 404)
                    return
                text = model.reply(body)
                if body.get("stream"):
                    self._stream(text, body)
                else:
                    self._send(_completion(text, body))

            def _send(self, payload: dict[str, Any], status: int = 200) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _stream(self, text: str, body: dict[str, Any]) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                chunk = _completion(text, body)
                chunk["object"] = "chat.completion.chunk"
                choice = chunk["choices"][0]
                choice["delta"] = choice.pop("message")
                done = {**chunk, "choices": [{"index": 0, "delta": {},
                                              "finish_reason": "stop"}]}
                choice["finish_reason"] = None
                for event in (chunk, done):
                    self.wfile.write(f"data: {json.dumps(event)}\n\n".encode())
                self.wfile.write(b"data: [DONE]\n\n")
                self.wfile.flush()

        return Handler


def _task_key(message: Mapping[str, Any]) -> str | None:
    content = message.get("content")
    if isinstance(content, list):
        content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
    try:
        payload = json.loads(content or "")
    except (TypeError, ValueError):
        return None
    observation = payload.get("observation") if isinstance(payload, dict) else None
    key = observation.get("task_key") if isinstance(observation, dict) else None
    return key if isinstance(key, str) else None


def _completion(text: str, body: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "id": "chatcmpl-scripted", "object": "chat.completion", "created": 0,
        "model": body.get("model", MODEL),
        "choices": [{"index": 0, "finish_reason": "stop",
                     "message": {"role": "assistant", "content": text}}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }
