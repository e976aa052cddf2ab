"""A scripted OpenAI-compatible HTTP server for tests that need exact model
behaviour (failures, invalid output, known structured output). It speaks the
real wire protocol on loopback, so the production client code runs unchanged."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

# A reply is (status, content): status 200 returns `content` as the assistant message.
Reply = tuple[int, str]


class ScriptedLLM:
    def __init__(self, script: Callable[[dict], Reply], *, port: int = 0) -> None:
        """`port` 0: any free one; a given port lets a test stop the server and start it again there."""
        self.script = script
        self.requests: list[dict] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:  # quiet
                pass

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))) or b"{}")
                server.requests.append(body)
                status, content = server.script(body)
                if status != 200:
                    payload = {"error": {"message": content, "type": "server_error"}}
                else:
                    payload = {
                        "id": f"chatcmpl-{len(server.requests)}", "object": "chat.completion", "created": int(time.time()),
                        "model": body.get("model", "scripted"),
                        "choices": [{"index": 0, "finish_reason": "stop",
                                     "message": {"role": "assistant", "content": content}}],
                        "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
                    }
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self._httpd = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self._httpd.server_address[1]}/v1"

    def __enter__(self) -> ScriptedLLM:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
