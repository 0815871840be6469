"""A real HTTP server in a thread that answers as an OpenAI-compatible completions server would (or, by
``mode``, as a broken one does), for the ``openai`` engine's tests: no model behind it, every reply ``text``."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@contextmanager
def fake_server(model: str, text: str = "Fine, thanks.", mode: str = "good") -> Iterator[tuple[str, str]]:
    """(url, the Server header it sends) of a server serving ``model``. ``mode``: "good"; "list" (GET /models
    answers a JSON list); "str-choice" (a completion's choice is a string)."""

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def _send(self, obj: Any) -> None:
            body = json.dumps(obj).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            listing = [{"id": model}]
            self._send(listing if mode == "list" else {"object": "list", "data": listing})

        def do_POST(self) -> None:  # noqa: N802
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            choice: Any = "oops" if mode == "str-choice" else {"text": text, "finish_reason": "stop"}
            self._send({"choices": [choice]})

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1", f"{Handler.server_version} {Handler.sys_version}"
    finally:
        server.shutdown()
        server.server_close()
