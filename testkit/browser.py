"""A small headless-Chromium driver for the e2e tests: the Chrome DevTools Protocol over
`--remote-debugging-pipe` (Chromium reads commands from its fd 3 and writes replies and events
to its fd 4, each JSON message ended by a NUL byte), so the standard library is enough.

    with Browser.launch("/usr/bin/chromium", tmp_path / "profile") as browser:
        page = browser.new_page()
        assert page.goto(url) == 200
        page.fill("input[name=email]", "a@b.example")
        assert page.submit("form") == 200

Forms are submitted by the browser itself (a mouse click on the button, or the form's
requestSubmit()), so the request carries the cookies, Origin and Sec-Fetch-* headers a user's
browser sends. Script runs through Runtime.evaluate, which a page's Content-Security-Policy does
not govern; the page's own scripts stay under it (no Page.setBypassCSP), and what CSP blocks
shows up in `page.console_errors`."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any

FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
    "--window-size=1280,900",
    "--remote-debugging-pipe",
)
TIMEOUT = 30.0  # every command and every wait, unless told otherwise

# Chromium wants the pipe on its fds 3 and 4. Popen's pass_fds keeps fds open under their own
# numbers, so a small Python trampoline moves them into place and then becomes Chromium (exec
# keeps the pid). Not preexec_fn, which is unsafe in a process with threads; not sh, whose dash
# takes single-digit fds only. Both ends first go above 9, so that neither dup2 clobbers the other.
_TRAMPOLINE = """
import fcntl, os, sys
ends = [fcntl.fcntl(int(fd), fcntl.F_DUPFD, 10) for fd in sys.argv[1:3]]
for fd in sys.argv[1:3]:
    os.close(int(fd))
for end, target in zip(ends, (3, 4)):
    os.dup2(end, target)
    os.close(end)
os.execv(sys.argv[3], sys.argv[3:])
"""

Message = dict[str, Any]


class BrowserError(Exception):
    """Chromium answered a command with an error, went away, or a wait ran out of time."""


class Browser:
    """One Chromium process and its DevTools pipe: a reader thread sorts replies (by id) from
    events (kept per session, in order, for the waits of `Page`)."""

    def __init__(self, proc: subprocess.Popen[bytes], to_chromium: int, from_chromium: int, log: Path):
        self.proc = proc
        self.log = log
        self._out = to_chromium
        self._in = from_chromium
        self._write_lock = threading.Lock()
        self._cond = threading.Condition()
        self._next_id = 0
        self._replies: dict[int, Message] = {}
        self._events: dict[str, list[Message]] = {}  # session id ("" for the browser) -> events
        self._listeners: dict[str, list[Callable[[Message], None]]] = {}
        self._gone: str | None = None  # why the pipe closed, once it has
        self._reader = threading.Thread(target=self._read, name="chromium-cdp", daemon=True)
        self._reader.start()

    @classmethod
    def launch(cls, chromium: str, profile_dir: Path, *extra: str) -> Browser:
        profile_dir.mkdir(parents=True, exist_ok=True)
        log = profile_dir / "chromium.log"
        cmd_r, cmd_w = os.pipe()  # we write commands, Chromium reads them on fd 3
        reply_r, reply_w = os.pipe()  # Chromium writes on fd 4, we read
        args = [sys.executable, "-c", _TRAMPOLINE, str(cmd_r), str(reply_w)]
        args += [chromium, *FLAGS, f"--user-data-dir={profile_dir}", *extra, "about:blank"]
        try:
            with open(log, "wb") as err:
                proc = subprocess.Popen(
                    args, stdin=subprocess.DEVNULL, stdout=err, stderr=err, pass_fds=(cmd_r, reply_w)
                )
        except BaseException:
            for fd in (cmd_w, reply_r):
                os.close(fd)
            raise
        finally:
            for fd in (cmd_r, reply_w):  # the child's ends: ours closed, so EOF means Chromium is gone
                os.close(fd)
        browser = cls(proc, cmd_w, reply_r, log)
        try:
            browser.send("Browser.getVersion")
        except BaseException:
            browser.close()
            raise
        return browser

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    # -- the pipe

    def _read(self) -> None:
        buffer = b""
        try:
            while True:
                chunk = os.read(self._in, 1 << 16)
                if not chunk:
                    break
                buffer += chunk
                *messages, buffer = buffer.split(b"\0")
                for raw in messages:
                    self._dispatch(json.loads(raw))
        except OSError as e:
            reason = f"reading the DevTools pipe failed: {e}"
        else:
            reason = "Chromium closed its DevTools pipe"
        with self._cond:
            self._gone = reason
            self._cond.notify_all()

    def _dispatch(self, message: Message) -> None:
        if "id" in message:
            with self._cond:
                self._replies[message["id"]] = message
                self._cond.notify_all()
            return
        session = message.get("sessionId", "")
        for listener in self._listeners.get(session, ()):
            listener(message)
        with self._cond:
            self._events.setdefault(session, []).append(message)
            self._cond.notify_all()

    def _write(self, data: bytes) -> None:
        with self._write_lock:
            view = memoryview(data)
            while view:
                view = view[os.write(self._out, view) :]

    def send(self, method: str, params: Message | None = None, session: str = "", timeout: float = TIMEOUT) -> Message:
        """One command; its result, or BrowserError with Chromium's error."""
        with self._cond:
            self._next_id += 1
            ident = self._next_id
        message: Message = {"id": ident, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        try:
            self._write(json.dumps(message).encode() + b"\0")
        except OSError as e:
            raise BrowserError(f"{method}: cannot write to Chromium ({e}){self._log_tail()}") from e
        reply = self._wait(lambda: self._replies.pop(ident, None), timeout, f"the reply to {method}")
        if "error" in reply:
            raise BrowserError(f"{method} failed: {reply['error'].get('message')} {reply['error'].get('data', '')}")
        result: Message = reply.get("result", {})
        return result

    def _wait(self, found: Callable[[], Any], timeout: float, what: str) -> Any:
        """`found()`'s first truthy value, checked under the lock each time a message arrives."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                value = found()
                if value:
                    return value
                if self._gone is not None:
                    raise BrowserError(f"{self._gone} while waiting for {what}{self._log_tail()}")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise BrowserError(f"timed out after {timeout}s waiting for {what}")
                self._cond.wait(left)

    def events_mark(self, session: str) -> int:
        with self._cond:
            return len(self._events.get(session, ()))

    def wait_event(
        self, session: str, since: int, match: Callable[[Message], bool], timeout: float, what: str
    ) -> Message:
        """The first event of `session` at or after position `since` that `match`es."""

        def found() -> Message | None:
            events = self._events.get(session, [])
            return next((e for e in events[since:] if match(e)), None)

        message: Message = self._wait(found, timeout, what)
        return message

    def _log_tail(self) -> str:
        try:
            tail = self.log.read_text(errors="replace")[-2000:]
        except OSError:
            return ""
        return f"\nchromium's log ({self.log}):\n{tail}" if tail.strip() else ""

    # -- pages

    def new_page(self, timeout: float = TIMEOUT) -> Page:
        target = self.send("Target.createTarget", {"url": "about:blank"}, timeout=timeout)["targetId"]
        session = self.send("Target.attachToTarget", {"targetId": target, "flatten": True}, timeout=timeout)
        page = Page(self, target, session["sessionId"], timeout)
        page._start()
        return page

    # -- the end

    def close(self, timeout: float = 10.0) -> None:
        """Browser.close, then the process's exit (killed if it does not come); fds closed."""
        if self.proc.poll() is None and self._gone is None:
            try:
                self.send("Browser.close", timeout=timeout)
            except BrowserError:
                pass  # the reply may not come before the pipe closes; the exit below is what counts
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout)
        self._reader.join(timeout)  # Chromium's exit closed its end: the reader has seen EOF
        for fd in (self._out, self._in):
            if fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self._out = self._in = -1


class Page:
    """One tab, attached with flatten=True: its commands carry its session id."""

    def __init__(self, browser: Browser, target: str, session: str, timeout: float):
        self.browser = browser
        self.target = target
        self.session = session
        self.timeout = timeout
        self.frame = ""
        self.status = 0  # the HTTP status of the document loaded last
        self.console_errors: list[str] = []
        browser._listeners[session] = [self._collect_errors]

    def _start(self) -> None:
        for domain in ("Page", "Network", "Runtime", "Log"):
            self.send(f"{domain}.enable")
        self.send("Page.setLifecycleEventsEnabled", {"enabled": True})
        self.frame = self.send("Page.getFrameTree")["frameTree"]["frame"]["id"]

    def send(self, method: str, params: Message | None = None) -> Message:
        return self.browser.send(method, params, session=self.session, timeout=self.timeout)

    def close(self) -> None:
        """Closes the tab (the browser stays)."""
        self.browser.send("Target.closeTarget", {"targetId": self.target}, timeout=self.timeout)

    def _collect_errors(self, message: Message) -> None:
        """Called on the reader thread for each of this page's events."""
        method, params = message["method"], message.get("params", {})
        if method == "Runtime.exceptionThrown":
            details = params["exceptionDetails"]
            text = details.get("exception", {}).get("description") or details.get("text", "")
            self.console_errors.append(f"exception: {text}")
        elif method == "Log.entryAdded" and params["entry"]["level"] == "error":
            entry = params["entry"]
            self.console_errors.append(f"{entry.get('source')}: {entry.get('text')} ({entry.get('url', '')})")
        elif method == "Runtime.consoleAPICalled" and params["type"] in ("error", "assert"):
            args = " ".join(str(a.get("value", a.get("description", ""))) for a in params.get("args", ()))
            self.console_errors.append(f"console.{params['type']}: {args}")

    # -- navigation

    def goto(self, url: str) -> int:
        """Loads `url` (until its load event); the HTTP status of the document."""
        mark = self.browser.events_mark(self.session)
        done = self.send("Page.navigate", {"url": url})
        if done.get("errorText"):
            raise BrowserError(f"navigating to {url} failed: {done['errorText']}")
        if "loaderId" not in done:  # a same-document navigation (a fragment): no new document
            return self.status
        return self._wait_loaded(mark, done["loaderId"], f"the load of {url}")

    def submit(self, css: str) -> int:
        """Submits the form `css` (requestSubmit()) or clicks the button `css`; waits for the new
        document's load and returns its HTTP status."""
        mark = self.browser.events_mark(self.session)
        is_form = self._call("el => el.tagName === 'FORM'", css, what=f"submit({css!r})")
        if is_form:
            self._call("el => el.requestSubmit()", css, what=f"submit({css!r})")
        else:
            self.click(css)
        return self._wait_loaded(mark, None, f"the navigation submitting {css!r}")

    def click(self, css: str) -> None:
        """A real mouse click (pressed and released) at the centre of the element `css`."""
        box = self._call(
            "el => { el.scrollIntoView({block: 'center'}); const r = el.getBoundingClientRect();"
            " return [r.left + r.width / 2, r.top + r.height / 2, r.width * r.height]; }",
            css,
            what=f"click({css!r})",
        )
        x, y, area = box
        if not area:
            raise BrowserError(f"{css!r} has no area to click on (hidden?)")
        for kind in ("mousePressed", "mouseReleased"):
            self.send("Input.dispatchMouseEvent", {"type": kind, "x": x, "y": y, "button": "left", "clickCount": 1})

    def _wait_loaded(self, mark: int, loader: str | None, what: str) -> int:
        """The main frame's document response (of `loader`, or the first one after `mark`), then
        that document's load event; the response's status."""
        frame = self.frame

        def document(e: Message) -> bool:
            p = e.get("params", {})
            return bool(
                e["method"] == "Network.responseReceived"
                and p.get("type") == "Document"
                and p.get("frameId") == frame
                and (loader is None or p.get("loaderId") == loader)
            )

        response = self.browser.wait_event(self.session, mark, document, self.timeout, f"the response of {what}")
        document_loader: str = response["params"]["loaderId"]

        def loaded(e: Message) -> bool:
            p = e.get("params", {})
            return bool(
                e["method"] == "Page.lifecycleEvent"
                and p.get("name") == "load"
                and p.get("frameId") == frame
                and p.get("loaderId") == document_loader
            )

        self.browser.wait_event(self.session, mark, loaded, self.timeout, f"the load event of {what}")
        self.status = response["params"]["response"]["status"]
        return self.status

    # -- forms

    def fill(self, css: str, value: str) -> None:
        """Sets the value of an input, textarea or select, with its input and change events."""
        self._call(
            "(el, value) => { el.focus(); el.value = value;"
            " if (el.value !== value) throw new Error('no option or wrong type for ' + JSON.stringify(value));"
            " el.dispatchEvent(new Event('input', {bubbles: true}));"
            " el.dispatchEvent(new Event('change', {bubbles: true})); }",
            css,
            value,
            what=f"fill({css!r}, {value!r})",
        )

    def check(self, css: str, on: bool = True) -> None:
        """Ticks (or clears) a checkbox or radio button, with its input and change events."""
        self._call(
            "(el, on) => { if (el.checked !== on) { el.checked = on;"
            " el.dispatchEvent(new Event('input', {bubbles: true}));"
            " el.dispatchEvent(new Event('change', {bubbles: true})); } }",
            css,
            on,
            what=f"check({css!r}, on={on})",
        )

    # -- reading

    @property
    def url(self) -> str:
        href: str = self.evaluate("location.href")
        return href

    def text(self, css: str) -> str | None:
        """The textContent of the first match, None when nothing matches."""
        found: str | None = self.evaluate(f"document.querySelector({json.dumps(css)})?.textContent ?? null")
        return found

    def texts(self, css: str) -> list[str]:
        found: list[str] = self.evaluate(
            f"Array.from(document.querySelectorAll({json.dumps(css)}), el => el.textContent)"
        )
        return found

    def attr(self, css: str, name: str) -> str | None:
        """The attribute `name` of the first match; None when nothing matches or it is absent."""
        found: str | None = self.evaluate(
            f"document.querySelector({json.dumps(css)})?.getAttribute({json.dumps(name)}) ?? null"
        )
        return found

    def attrs(self, css: str, name: str) -> list[str | None]:
        found: list[str | None] = self.evaluate(
            f"Array.from(document.querySelectorAll({json.dumps(css)}), el => el.getAttribute({json.dumps(name)}))"
        )
        return found

    def html(self) -> str:
        found: str = self.evaluate("document.documentElement.outerHTML")
        return found

    def screenshot(self, path: Path, full_page: bool = True) -> Path:
        """A PNG of the viewport, or of the whole page's layout."""
        params: Message = {"format": "png"}
        if full_page:
            size = self.send("Page.getLayoutMetrics")["cssContentSize"]
            params["captureBeyondViewport"] = True
            params["clip"] = {"x": 0, "y": 0, "width": size["width"], "height": size["height"], "scale": 1}
        data = self.send("Page.captureScreenshot", params)["data"]
        path.write_bytes(base64.b64decode(data))
        return path

    # -- script (Runtime.evaluate: DevTools' own, outside the page's CSP)

    def evaluate(self, expression: str, what: str = "") -> Any:
        """The value of `expression` (awaited if a promise), or BrowserError with its exception."""
        done = self.send("Runtime.evaluate", {"expression": expression, "returnByValue": True, "awaitPromise": True})
        if "exceptionDetails" in done:
            details = done["exceptionDetails"]
            text = details.get("exception", {}).get("description") or details.get("text")
            first = str(text).splitlines()[0] if text else "an exception"
            raise BrowserError(f"{what or repr(expression[:200])}: {first}")
        return done["result"].get("value")

    def _call(self, function: str, css: str, *args: Any, what: str = "") -> Any:
        """`function(element, *args)` on the first match of `css`; BrowserError when none."""
        arguments = ", ".join(json.dumps(a) for a in args)
        what = what or f"on {css!r}"
        return self.evaluate(
            f"(() => {{ const el = document.querySelector({json.dumps(css)});"
            f" if (!el) throw new Error('no element matches ' + {json.dumps(json.dumps(css))});"
            f" return ({function})(el{', ' if args else ''}{arguments}); }})()",
            what,
        )
