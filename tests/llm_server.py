"""An OpenAI-compatible /v1/chat/completions server on loopback, for tests driven through the
real `openai` client. It answers from a queue of (status, headers, text), or from a function
of the request body (for several clients at once, e.g. the processes of an eval)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

Reply = tuple[int, dict, str]


class ScriptedServer:
    def __init__(self, script: list[Reply] | Callable[[dict], Reply]) -> None:
        self.script = script if isinstance(script, list) else []
        self.responder = None if isinstance(script, list) else script
        self.requests: list[dict] = []
        self.times: list[float] = []  # when each request arrived (time.time())
        self._lock = threading.Lock()
        outer = self

        class H(BaseHTTPRequestHandler):
            def log_message(self, *a):  # quiet
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with outer._lock:
                    outer.requests.append(body)
                    outer.times.append(time.time())
                    status, headers, text = outer.responder(body) if outer.responder else outer.script.pop(0)
                if status == 200:
                    payload = {
                        "id": "x", "object": "chat.completion", "created": 0, "model": body["model"],
                        "choices": [{"index": 0, "finish_reason": "stop",
                                     "message": {"role": "assistant", "content": text}}],
                        "usage": {"prompt_tokens": 100, "completion_tokens": 10, "total_tokens": 110},
                    }  # fmt: skip
                else:
                    payload = {"error": {"message": text, "type": "x"}}
                data = json.dumps(payload).encode()
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
