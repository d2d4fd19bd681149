"""testkit.browser, the DevTools-pipe driver of headless Chromium, against a small HTTP server
of this file's own: a form under a strict CSP posted by the browser, a 404, full-page
screenshots, and the errors a CSP-blocked inline script leaves."""

from __future__ import annotations

import html
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qsl

import pytest

from testkit.browser import Browser, Page
from testkit.servers import wait_until

CSP = "default-src 'none'; script-src 'none'; form-action 'self'"

FORM = """<!doctype html><html><head><title>form</title></head><body>
<form method="post" action="/echo">
  <input type="text" name="name">
  <label><input type="checkbox" name="agree" value="yes"> agree</label>
  <select name="plan"><option value="basic">basic</option><option value="pro">pro</option></select>
  <button type="submit" id="send">send</button>
</form></body></html>"""
LONG = "<!doctype html><html><body>" + "<p>line</p>" * 300 + "</body></html>"
INLINE_SCRIPT = "<!doctype html><html><body><p>x</p><script>document.title = 'ran'</script></body></html>"
NOT_FOUND = "<!doctype html><html><body><h1>not here</h1></body></html>"


class Site(BaseHTTPRequestHandler):
    """The pages above, each under CSP; POST /echo shows what the browser sent."""

    PAGES = {"/form": FORM, "/long": LONG, "/inline-script": INLINE_SCRIPT}

    def do_GET(self) -> None:
        page = self.PAGES.get(self.path)
        self._answer(200 if page else 404, page or NOT_FOUND)

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", 0))).decode()
        received = [*parse_qsl(body, keep_blank_values=True)]
        received += [(f"header:{h}", self.headers.get(h, "")) for h in ("Origin", "Sec-Fetch-Site")]
        rows = "".join(f"<dt>{html.escape(k)}</dt><dd>{html.escape(v)}</dd>" for k, v in received)
        self._answer(200, f"<!doctype html><html><body><h1>echo</h1><dl>{rows}</dl></body></html>")

    def _answer(self, status: int, page: str) -> None:
        data = page.encode()
        self.send_response(status)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Security-Policy", CSP)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def site() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Site)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()
    thread.join()


@pytest.fixture(scope="module")
def browser(chromium: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Browser]:
    """This file's own, to check that the browser has exited and been reaped once its block
    ends; Debian's chromium, installed by tests/e2e/conftest.py's `chromium` if missing."""
    with Browser.launch(chromium, tmp_path_factory.mktemp("chromium-profile")) as browser:
        yield browser
    assert browser.proc.returncode is not None  # exited, and reaped


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    page = browser.new_page()
    yield page
    page.close()


def echoed(page: Page) -> dict[str, str]:
    return dict(zip(page.texts("dt"), page.texts("dd")))


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", data[:8]
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


def test_a_form_filled_and_submitted_is_the_browsers_own_same_origin_post(site: str, page: Page) -> None:
    assert page.goto(f"{site}/form") == 200
    assert page.url == f"{site}/form"
    assert page.text("button") == "send"
    assert page.attrs("option", "value") == ["basic", "pro"]
    page.fill("input[name=name]", "Ada Lovelace")
    page.check("input[name=agree]")
    page.fill("select[name=plan]", "pro")

    assert page.submit("#send") == 200  # a mouse click on the button

    assert page.url == f"{site}/echo"
    assert page.text("h1") == "echo"
    assert echoed(page) == {
        "name": "Ada Lovelace",
        "agree": "yes",
        "plan": "pro",
        "header:Origin": site,
        "header:Sec-Fetch-Site": "same-origin",
    }
    assert page.console_errors == []


def test_a_form_submitted_by_its_selector_leaves_an_unticked_box_out(site: str, page: Page) -> None:
    assert page.goto(f"{site}/form") == 200
    page.check("input[name=agree]")
    page.check("input[name=agree]", on=False)
    assert page.submit("form") == 200  # requestSubmit()
    assert echoed(page) == {
        "name": "",
        "plan": "basic",
        "header:Origin": site,
        "header:Sec-Fetch-Site": "same-origin",
    }


def test_a_missing_page_is_a_404_and_missing_elements_are_none(site: str, page: Page) -> None:
    assert page.goto(f"{site}/nothing-here") == 404
    assert page.text("h1") == "not here"
    assert page.text("form") is None
    assert page.attr("h1", "id") is None
    assert page.texts("p") == []
    assert "<h1>not here</h1>" in page.html()


def test_full_page_screenshots_are_pngs_as_tall_as_the_page(site: str, page: Page, tmp_path: Path) -> None:
    page.goto(f"{site}/form")
    _, short = png_size(page.screenshot(tmp_path / "form.png"))
    page.goto(f"{site}/long")
    width, tall = png_size(page.screenshot(tmp_path / "long.png"))
    _, viewport = png_size(page.screenshot(tmp_path / "viewport.png", full_page=False))
    assert width == 1280
    assert tall > 300 * 16 > viewport >= short, (short, tall, viewport)


def test_an_inline_script_blocked_by_csp_is_a_console_error(site: str, page: Page) -> None:
    assert page.goto(f"{site}/inline-script") == 200
    wait_until(lambda: page.console_errors, timeout=10, what="the CSP violation's console error")
    assert any("Content Security Policy" in e for e in page.console_errors), page.console_errors
    assert page.evaluate("document.title") != "ran"  # blocked, while DevTools' own evaluation runs
