"""A tiny headless-Chromium driver for the browser tests: DevTools protocol over a pipe.

Chromium runs with ``--remote-debugging-pipe`` (commands on its fd 3, replies and events on
its fd 4, NUL-separated JSON), so no port and no websocket library is needed. Each page is
opened in its own target with the network emulated offline and a blocked proxy as a second
wall; everything the page does is recorded from the browser's side, not by script in the
page: uncaught exceptions, console and browser log errors (CSP violations among them),
every request the page started, and dialogs (``alert``) it opened.
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

CHROMIUM_CANDIDATES = (
    "/usr/lib/chromium/chromium",
    "chromium",
    "chromium-browser",
    "google-chrome",
    "google-chrome-stable",
)
FLAGS = (
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--no-first-run",
    "--no-default-browser-check",
    "--disable-extensions",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-default-apps",
    "--disable-quic",
    "--mute-audio",
    "--hide-scrollbars",
    "--disable-features=Translate,MediaRouter,OptimizationHints",
    # a second wall besides the emulated offline network: nothing resolves, no proxy answers
    "--proxy-server=127.0.0.1:9",
    "--proxy-bypass-list=<-loopback>",
    "--host-resolver-rules=MAP * ~NOTFOUND",
    # pages opened over the protocol count as background tabs: keep their timers and
    # animation frames running (chart.js draws CircuitsVis's zoomed view in one)
    "--disable-background-timer-throttling",
    "--disable-renderer-backgrounding",
    "--disable-backgrounding-occluded-windows",
    # software canvases, so that screenshots include large <canvas> elements
    "--disable-accelerated-2d-canvas",
    "--remote-debugging-pipe",
)


def find_chromium() -> str | None:
    explicit = os.environ.get("INTERP_CHROMIUM")
    if explicit:
        return explicit
    for name in CHROMIUM_CANDIDATES:
        found = (
            shutil.which(name) if "/" not in name else (name if os.access(name, os.X_OK) else None)
        )
        if found:
            return found
    return None


MAX_SHOT_HEIGHT = 8000  # px; longer pages are cut in the screenshot, not in the checks


# the navigation has committed and the page finished loading: until then the evaluation may
# run on the previous about:blank document, where every "all views drawn" check is vacuously
# true (seen under load: a page reported ready with 0 of 5 figures)
LOADED_JS = "(location.protocol === 'file:' && document.readyState === 'complete')"


class BrowserError(RuntimeError):
    pass


@dataclass
class PageResult:
    """What a page did while it was open."""

    url: str
    exceptions: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # console.error and browser log errors
    requests: list[str] = field(default_factory=list)  # every URL the page asked for
    dialogs: list[str] = field(default_factory=list)
    values: dict[str, object] = field(default_factory=dict)  # results of checks
    load_s: float = 0.0

    def network_requests(self) -> list[str]:
        """Requests that would leave the machine (anything but the file itself and data:)."""
        return [u for u in self.requests if not u.startswith(("file:", "data:", "blob:", "about:"))]


class Chromium:
    """One headless browser process; open pages with :meth:`open`."""

    def __init__(self, executable: str, *, timeout_s: float = 30.0):
        self.timeout_s = timeout_s
        self._profile = tempfile.TemporaryDirectory(prefix="interp-chromium-")
        self._log = open(Path(self._profile.name) / "chromium.log", "wb")
        to_child_r, self._to_child = os.pipe()
        self._from_child, from_child_w = os.pipe()
        # Chromium reads commands on fd 3 and writes on fd 4: move the child's ends above 10
        # (so dup2 onto 3 and 4 cannot clobber them) and let a tiny exec trampoline put them
        # in place (no preexec_fn, which is unsafe with threads)
        r, w = (fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10) for fd in (to_child_r, from_child_w))
        for fd in (to_child_r, from_child_w):
            os.close(fd)
        to_child_r, from_child_w = r, w
        trampoline = (
            "import os, sys; os.dup2(int(sys.argv[1]), 3); os.dup2(int(sys.argv[2]), 4);"
            " os.close(int(sys.argv[1])); os.close(int(sys.argv[2]));"
            " os.execv(sys.argv[3], sys.argv[3:])"
        )
        self._proc = subprocess.Popen(
            [
                sys.executable,
                "-c",
                trampoline,
                str(r),
                str(w),
                executable,
                *FLAGS,
                f"--user-data-dir={self._profile.name}",
                "about:blank",
            ],
            # a file, not a pipe: Chromium logs a lot (D-Bus) and a full pipe would stall it
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=self._log,
            pass_fds=(r, w),
            start_new_session=True,  # its own group, to end it cleanly
        )
        os.close(to_child_r)
        os.close(from_child_w)
        self._buffer = b""
        self._next_id = 0
        self._events: list[dict] = []
        try:
            self.version = self.call("Browser.getVersion").get("product", "")
        except BaseException:
            self.close()
            raise

    # -- protocol -----------------------------------------------------------------------
    def _send(self, message: dict) -> None:
        data = json.dumps(message).encode() + b"\0"
        while data:
            written = os.write(self._to_child, data)
            data = data[written:]

    def _read_message(self, deadline: float) -> dict:
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                raise BrowserError("timed out waiting for Chromium")
            ready, _, _ = select.select([self._from_child], [], [], left)
            if not ready:
                continue
            chunk = os.read(self._from_child, 1 << 20)
            if not chunk:
                raise BrowserError("Chromium closed the pipe: " + self._stderr_tail())
            self._buffer += chunk
        raw, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(raw)

    def call(
        self,
        method: str,
        params: dict | None = None,
        *,
        session: str | None = None,
        timeout_s: float | None = None,
    ) -> dict:
        self._next_id += 1
        message_id = self._next_id
        message = {"id": message_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        self._send(message)
        deadline = time.monotonic() + (timeout_s or self.timeout_s)
        while True:
            reply = self._read_message(deadline)
            if reply.get("id") == message_id:
                if "error" in reply:
                    raise BrowserError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self._dispatch(reply)

    def _dispatch(self, message: dict) -> None:
        if "id" in message:  # the reply to a command sent without waiting
            return
        self._events.append(message)
        if message.get("method") == "Page.javascriptDialogOpening":
            # an open alert() blocks the page and every evaluate: dismiss it now, unawaited
            self._next_id += 1
            self._send(
                {
                    "id": self._next_id,
                    "method": "Page.handleJavaScriptDialog",
                    "params": {"accept": False},
                    "sessionId": message.get("sessionId"),
                }
            )

    def _drain(self, wait_s: float = 0.0) -> None:
        deadline = time.monotonic() + wait_s
        while True:
            left = deadline - time.monotonic()
            ready, _, _ = select.select([self._from_child], [], [], max(left, 0))
            if not ready and b"\0" not in self._buffer:
                return
            self._dispatch(self._read_message(time.monotonic() + 5))

    def _stderr_tail(self) -> str:
        self._log.flush()
        log = (Path(self._profile.name) / "chromium.log").read_bytes()
        return log.decode(errors="replace")[-2000:]

    # -- pages --------------------------------------------------------------------------
    def open(
        self,
        path: Path,
        *,
        ready_js: str,
        checks: dict[str, str] | None = None,
        screenshot: Path | None = None,
        bypass_csp: bool = False,
        width: int = 1200,
        settle_s: float = 0.3,
        cpu_slowdown: float = 1.0,
    ) -> PageResult:
        """Load ``path``, wait until ``ready_js`` is true (or time out), evaluate ``checks``
        (name -> JS expression returning JSON-able data), and record what the page did.
        ``cpu_slowdown`` > 1 runs the page on a CPU that many times slower (DevTools' CPU
        throttling), for timings that stand for a slower machine."""
        target = self.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.call("Target.attachToTarget", {"targetId": target, "flatten": True})[
            "sessionId"
        ]
        url = Path(path).resolve().as_uri()
        result = PageResult(url=url)
        try:
            for method in ("Runtime.enable", "Log.enable", "Network.enable", "Page.enable"):
                self.call(method, session=session)
            self.call(
                "Network.emulateNetworkConditions",
                {"offline": True, "latency": 0, "downloadThroughput": -1, "uploadThroughput": -1},
                session=session,
            )
            self.call(
                "Emulation.setDeviceMetricsOverride",
                {"width": width, "height": 900, "deviceScaleFactor": 1, "mobile": False},
                session=session,
            )
            self.call("Page.bringToFront", session=session)
            if cpu_slowdown != 1.0:
                self.call("Emulation.setCPUThrottlingRate", {"rate": cpu_slowdown}, session=session)
            if bypass_csp:
                self.call("Page.setBypassCSP", {"enabled": True}, session=session)
            self._events.clear()
            start = time.monotonic()
            self.call("Page.navigate", {"url": url}, session=session)
            deadline = start + self.timeout_s
            ready = False
            while time.monotonic() < deadline:
                self._drain(0.05)
                value = self.call(
                    "Runtime.evaluate",
                    {"expression": f"Boolean({LOADED_JS} && ({ready_js}))", "returnByValue": True},
                    session=session,
                )
                if value.get("result", {}).get("value") is True:
                    ready = True
                    break
            result.load_s = time.monotonic() - start
            self._drain(settle_s)  # late errors and requests
            result.values["ready"] = ready
            for name, expression in (checks or {}).items():
                value = self.call(
                    "Runtime.evaluate",
                    {"expression": f"JSON.stringify({expression})", "returnByValue": True},
                    session=session,
                )
                if "exceptionDetails" in value:
                    result.values[name] = {"error": value["exceptionDetails"].get("text")}
                else:
                    raw = value.get("result", {}).get("value")
                    result.values[name] = None if raw is None else json.loads(raw)
            if screenshot is not None:
                self._screenshot(session, screenshot, width)
            self._drain(0)
        finally:
            self._collect(session, result)
            self.call("Target.closeTarget", {"targetId": target})
        return result

    def _evaluate(self, session: str, expression: str):
        value = self.call(
            "Runtime.evaluate",
            {"expression": f"JSON.stringify({expression})", "returnByValue": True},
            session=session,
        )
        if "exceptionDetails" in value:
            return {"error": value["exceptionDetails"].get("text")}
        raw = value.get("result", {}).get("value")
        return None if raw is None else json.loads(raw)

    def _watch(self, session: str) -> None:
        """Record what a page or frame does, offline, from its first script on."""
        for method in ("Runtime.enable", "Log.enable", "Network.enable", "Page.enable"):
            self.call(method, session=session)
        self.call(
            "Network.emulateNetworkConditions",
            {"offline": True, "latency": 0, "downloadThroughput": -1, "uploadThroughput": -1},
            session=session,
        )
        self.call(
            "Target.setAutoAttach",
            {"autoAttach": True, "waitForDebuggerOnStart": True, "flatten": True},
            session=session,
        )

    def open_frames(
        self,
        path: Path,
        *,
        ready_js: str,
        checks: dict[str, str] | None = None,
        top_checks: dict[str, str] | None = None,
        n_frames: int = 1,
        width: int = 1200,
        settle_s: float = 0.3,
    ) -> tuple[PageResult, list[PageResult]]:
        """Load ``path`` and watch each iframe that runs in a process of its own (a sandboxed
        ``srcdoc`` frame, as a notebook shows a Report) as its own page: wait until
        ``ready_js`` is true in ``n_frames`` frames, evaluate ``checks`` in each frame and
        ``top_checks`` in the page. Frames are paused on creation until they are watched, so
        their first errors and requests are recorded too."""
        target = self.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.call("Target.attachToTarget", {"targetId": target, "flatten": True})[
            "sessionId"
        ]
        url = Path(path).resolve().as_uri()
        top = PageResult(url=url)
        frames: dict[str, PageResult] = {}
        try:
            self._watch(session)
            self.call(
                "Emulation.setDeviceMetricsOverride",
                {"width": width, "height": 900, "deviceScaleFactor": 1, "mobile": False},
                session=session,
            )
            self._events.clear()
            start = time.monotonic()
            self.call("Page.navigate", {"url": url}, session=session)
            deadline = start + self.timeout_s
            ready = False
            while time.monotonic() < deadline and not ready:
                self._drain(0.05)
                for event in list(self._events):
                    if event.get("method") != "Target.attachedToTarget":
                        continue
                    child = event["params"]["sessionId"]
                    if child not in frames:
                        frames[child] = PageResult(url=event["params"]["targetInfo"]["url"])
                        self._watch(child)
                        self.call("Runtime.runIfWaitingForDebugger", session=child)
                loaded = self._evaluate(session, LOADED_JS) is True
                done = [
                    self._evaluate(
                        child, f"document.readyState === 'complete' && Boolean({ready_js})"
                    )
                    is True
                    for child in frames
                ]
                ready = loaded and len(frames) >= n_frames and all(done)
            top.load_s = time.monotonic() - start
            self._drain(settle_s)
            top.values["ready"] = ready
            for name, expression in (top_checks or {}).items():
                top.values[name] = self._evaluate(session, expression)
            for child, result in frames.items():
                result.values["ready"] = ready
                for name, expression in (checks or {}).items():
                    result.values[name] = self._evaluate(child, expression)
            self._drain(0)
        finally:
            for child, result in frames.items():
                self._collect(child, result)
            self._collect(session, top)
            self.call("Target.closeTarget", {"targetId": target})
        return top, list(frames.values())

    def _screenshot(self, session: str, path: Path, width: int) -> None:
        """Grow the viewport to the page, let it redraw, and capture it. (Capturing beyond
        the viewport resizes the page during the capture; chart.js then clears its canvas
        and redraws too late for the picture.)"""
        height = self.call(
            "Runtime.evaluate",
            {"expression": "document.documentElement.scrollHeight", "returnByValue": True},
            session=session,
        )["result"]["value"]
        self.call(
            "Emulation.setDeviceMetricsOverride",
            {
                "width": width,
                "height": int(min(max(height, 200), MAX_SHOT_HEIGHT)),
                "deviceScaleFactor": 1,
                "mobile": False,
            },
            session=session,
        )
        self._drain(0.5)
        shot = self.call("Page.captureScreenshot", {"format": "png"}, session=session)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(shot["data"]))

    def _collect(self, session: str, result: PageResult) -> None:
        kept = []
        for event in self._events:
            if event.get("sessionId") != session:
                kept.append(event)
                continue
            method, params = event.get("method"), event.get("params", {})
            if method == "Runtime.exceptionThrown":
                details = params.get("exceptionDetails", {})
                text = details.get("exception", {}).get("description") or details.get("text")
                result.exceptions.append(str(text))
            elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
                result.errors.append(
                    " ".join(
                        str(a.get("value", a.get("description"))) for a in params.get("args", [])
                    )
                )
            elif method == "Log.entryAdded" and params.get("entry", {}).get("level") == "error":
                entry = params["entry"]
                result.errors.append(
                    f"{entry.get('source')}: {entry.get('text')} {entry.get('url', '')}".strip()
                )
            elif method == "Network.requestWillBeSent":
                result.requests.append(params.get("request", {}).get("url", ""))
            elif method == "Page.javascriptDialogOpening":
                result.dialogs.append(f"{params.get('type')}: {params.get('message')}")
        self._events = kept

    def close(self) -> None:
        if self._proc.poll() is None:
            try:
                self.call("Browser.close", timeout_s=5)
            except (BrowserError, OSError):
                pass
            try:
                self._proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                os.killpg(self._proc.pid, signal.SIGKILL)  # the group this class started
                self._proc.wait()
        for fd in (self._to_child, self._from_child):
            try:
                os.close(fd)
            except OSError:
                pass
        self._log.close()
        self._profile.cleanup()

    def __enter__(self) -> Chromium:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
