"""A headless Chromium driven over the DevTools protocol: load a page, collect console
errors and exceptions, evaluate JavaScript, take a screenshot. No downloads: it uses the
system's ``chromium`` (Debian's package; ``.ci/run`` installs it)."""

import base64
import importlib.util
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
import urllib.request

FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--remote-debugging-port=0", "--window-size=1400,1000",
]  # fmt: skip


def chromium_path() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


def unavailable() -> str | None:
    """Why a ``Browser`` cannot run here (None: it can). The GPU machines have neither
    Chromium nor websocket-client: the report tests that need them skip there, the rest run."""
    if chromium_path() is None:
        return "no chromium on PATH (apt-get install chromium; .ci/run does)"
    if importlib.util.find_spec("websocket") is None:
        return "no websocket-client (pip install -r requirements-test.txt)"
    return None


class Browser:
    def __init__(self):
        self.profile = tempfile.mkdtemp(prefix="chromium-")
        self.proc = subprocess.Popen(
            [chromium_path(), *FLAGS, f"--user-data-dir={self.profile}", "about:blank"], stderr=subprocess.PIPE, text=True
        )
        port = None
        deadline = time.time() + 30
        while time.time() < deadline and port is None:
            line = self.proc.stderr.readline()
            m = re.search(r"DevTools listening on ws://[^:]+:(\d+)/", line)
            port = m and int(m.group(1))
        if port is None:
            self.close()
            raise RuntimeError("chromium did not start its DevTools endpoint")
        pages = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10))
        target = next(p for p in pages if p.get("type") == "page")
        import websocket  # websocket-client: imported here so that this module loads without it (``unavailable``)

        self.ws = websocket.create_connection(target["webSocketDebuggerUrl"], timeout=60, suppress_origin=True)
        self.next_id = 0
        self.events = []
        for domain in ("Runtime", "Log", "Page"):
            self.call(f"{domain}.enable")

    def call(self, method, **params):
        self.next_id += 1
        self.ws.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv())
            if msg.get("id") == self.next_id:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})
            self.events.append(msg)

    def wait_for(self, event, timeout=60):
        deadline = time.time() + timeout
        while time.time() < deadline:
            for i, msg in enumerate(self.events):
                if msg.get("method") == event:
                    return self.events.pop(i)
            self.events.append(json.loads(self.ws.recv()))
        raise TimeoutError(event)

    def open(self, path):
        self.call("Page.navigate", url="file://" + os.path.abspath(path))
        self.wait_for("Page.loadEventFired")

    def evaluate(self, expression):
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            raise RuntimeError(result["exceptionDetails"])
        return result["result"].get("value")

    def errors(self) -> list[str]:
        """Console errors, uncaught exceptions and error log entries seen so far."""
        out = []
        for msg in self.events:
            m, p = msg.get("method"), msg.get("params", {})
            if m == "Runtime.exceptionThrown":
                out.append(json.dumps(p.get("exceptionDetails", {}))[:500])
            elif m == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
                out.append(" ".join(str(a.get("value", a.get("description", ""))) for a in p.get("args", [])))
            elif m == "Log.entryAdded" and p.get("entry", {}).get("level") == "error":
                out.append(p["entry"].get("text", ""))
        return out

    def screenshot(self, path):
        data = self.call("Page.captureScreenshot", format="png", captureBeyondViewport=True)["data"]
        with open(path, "wb") as f:
            f.write(base64.b64decode(data))

    def close(self):
        try:
            if getattr(self, "ws", None):
                self.ws.close()
        finally:
            self.proc.kill()
            self.proc.wait()
            shutil.rmtree(self.profile, ignore_errors=True)
