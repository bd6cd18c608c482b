"""The web console in a real browser: headless Chromium driven over the Chrome DevTools
Protocol (the `websocket-client` package speaks it; no other driver), against a running dev
cluster. Run by .ci/extra/console-browser.sh, which starts the cluster and passes:

    console_browser.py CHROMIUM CONSOLE_URL TRIREME_CLI GRPC_ENDPOINT ARTIFACTS KEY SECRET

It logs in, sees a queue's depth rise after sends, opens a dead-letter queue and redrives its
one message (confirming, then watching the task complete and the message return), checks the
nodes page, and that a body with markup shows as text. Every step saves a screenshot in
ARTIFACTS. Every wait is bounded; a failed check raises with what the page showed.
"""

import base64
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request

import websocket

STEP_TIMEOUT_S = 20.0


class Browser:
    """One headless Chromium with one page, and a DevTools connection to it."""

    def __init__(self, chromium):
        self.profile = tempfile.mkdtemp(prefix="console-browser-")
        self.process = subprocess.Popen(
            [
                chromium,
                "--headless=new",
                "--no-sandbox",  # CI runs as root, where Chromium's sandbox refuses to start
                "--disable-gpu",
                "--no-first-run",
                "--no-default-browser-check",
                "--window-size=1280,900",
                "--hide-scrollbars",
                "--remote-debugging-port=0",
                "--remote-debugging-address=127.0.0.1",
                f"--user-data-dir={self.profile}",
                "about:blank",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        port_file = os.path.join(self.profile, "DevToolsActivePort")
        deadline = time.monotonic() + STEP_TIMEOUT_S
        while not os.path.exists(port_file) or os.path.getsize(port_file) == 0:
            if time.monotonic() > deadline or self.process.poll() is not None:
                raise RuntimeError("Chromium did not open its DevTools port")
            time.sleep(0.1)
        with open(port_file) as f:
            port = int(f.readline())
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as answer:
            targets = json.load(answer)
        page = next(t for t in targets if t["type"] == "page")
        self.socket = websocket.create_connection(
            page["webSocketDebuggerUrl"], timeout=STEP_TIMEOUT_S, suppress_origin=True
        )
        self.next_id = 0
        self.events = []
        self.call("Page.enable")
        self.call("Runtime.enable")

    def call(self, method, **params):
        """Sends one command and returns its result (events that arrive meanwhile are kept)."""
        self.next_id += 1
        self.socket.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        deadline = time.monotonic() + STEP_TIMEOUT_S
        while time.monotonic() < deadline:
            message = json.loads(self.socket.recv())
            if message.get("id") == self.next_id:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message.get("result", {})
            self.events.append(message)
        raise TimeoutError(method)

    def await_load(self):
        """Waits for the page's load event."""
        deadline = time.monotonic() + STEP_TIMEOUT_S
        while time.monotonic() < deadline:
            for index, event in enumerate(self.events):
                if event.get("method") == "Page.loadEventFired":
                    del self.events[: index + 1]
                    return
            self.events.append(json.loads(self.socket.recv()))
        raise TimeoutError("the page did not load")

    def open(self, url):
        self.events.clear()
        self.call("Page.navigate", url=url)
        self.await_load()

    def evaluate(self, expression):
        """The value of `expression` in the page (the test's script; the pages have none)."""
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def click_and_load(self, selector):
        self.events.clear()
        self.evaluate(f"document.querySelector({json.dumps(selector)}).click()")
        self.await_load()

    def html(self):
        """The page's markup, read through the DOM domain (works with scripts off too)."""
        root = self.call("DOM.getDocument", depth=0)["root"]["nodeId"]
        return self.call("DOM.getOuterHTML", nodeId=root)["outerHTML"]

    def screenshot(self, path):
        data = self.call("Page.captureScreenshot", format="png", captureBeyondViewport=True)
        with open(path, "wb") as f:
            f.write(base64.b64decode(data["data"]))
        print(f"  screenshot {path}")

    def close(self):
        try:
            self.socket.close()
        finally:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
            shutil.rmtree(self.profile, ignore_errors=True)


def until(what, check, limit_s=STEP_TIMEOUT_S):
    """Polls `check` (which returns a value, falsy while not yet) for at most `limit_s`."""
    deadline = time.monotonic() + limit_s
    last = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


def main():
    chromium, console, cli, endpoint, artifacts, key, secret = sys.argv[1:8]

    def trireme(*args):
        run = subprocess.run(
            [cli, "--endpoint", endpoint, *args], capture_output=True, text=True, timeout=60
        )
        if run.returncode != 0:
            raise RuntimeError(f"trireme {' '.join(args)}: {run.stderr}")
        return run.stdout

    def shot(name):
        browser.screenshot(os.path.join(artifacts, name))

    def cell(queue, column):
        return browser.evaluate(
            f"(document.querySelector('tr[data-queue=\"{queue}\"] td.{column}') || {{}}).textContent"
        )

    trireme("queue", "create", "orders")
    trireme("queue", "create", "payments-dlq")
    trireme("queue", "create", "payments", "--dead-letter-queue", "payments-dlq",
            "--max-receive-count", "1")

    browser = Browser(chromium)
    try:
        print("login")
        browser.open(f"{console}/console")
        assert browser.evaluate("location.pathname") == "/console/login", browser.html()
        browser.evaluate(
            f"document.querySelector('[name=access_key]').value = {json.dumps(key)};"
            f"document.querySelector('[name=secret]').value = {json.dumps(secret)};"
        )
        shot("01-login.png")
        browser.click_and_load("#login")
        assert browser.evaluate("location.pathname") == "/console", browser.html()
        assert key in browser.evaluate("document.querySelector('header').textContent")

        print("depth before and after sends")
        assert cell("orders", "ready") == "0", browser.html()
        shot("02-queues-empty.png")
        for i in range(7):
            trireme("send", "orders", f"order {i}")
        trireme("send", "orders", "<b>not bold</b> & <script>alert(1)</script>")

        def eight_ready():
            browser.open(f"{console}/console")
            return cell("orders", "ready") == "8"

        until("orders shows 8 ready", eight_ready)
        # Two samples of the ring at least, so the chart draws a line and not a point.
        def charted():
            browser.open(f"{console}/console")
            path = browser.evaluate(
                "document.querySelector('tr[data-queue=\"orders\"] svg path.ready').getAttribute('d')"
            )
            return path.count(" L") >= 3

        until("the chart has a sample before now", charted, limit_s=15)
        shot("03-queues-after-sends.png")

        print("markup in a body is text")
        browser.open(f"{console}/console/queues/orders")
        bodies = browser.evaluate(
            "[...document.querySelectorAll('#messages code.body')].map(c => c.textContent)"
        )
        assert "<b>not bold</b> & <script>alert(1)</script>" in bodies, bodies
        assert browser.evaluate("document.querySelectorAll('#messages b, main script').length") == 0
        shot("04-queue-peek.png")

        print("dead-letter queue and redrive")
        trireme("send", "payments", "card declined")
        trireme("receive", "payments", "--visibility", "0")
        # The second receive finds it past maxReceiveCount and moves it to payments-dlq.
        trireme("receive", "payments", "--visibility", "0")

        def dead_lettered():
            browser.open(f"{console}/console/queues/payments-dlq")
            return browser.evaluate("document.querySelectorAll('#messages tbody tr').length") == 1

        until("payments-dlq shows its message", dead_lettered)
        row = browser.evaluate(
            "[...document.querySelectorAll('#messages tbody tr td')].map(td => td.textContent)"
        )
        assert "payments" in row and "card declined" in row, row
        shot("05-dead-letter-queue.png")
        browser.click_and_load("#redrive-start")
        assert "Yes, redrive" in browser.html()
        shot("06-redrive-confirm.png")
        browser.click_and_load("#redrive-confirm")

        def completed():
            browser.open(f"{console}/console/queues/payments-dlq")
            status = browser.evaluate(
                "(document.querySelector('#redrive-tasks td.status') || {}).textContent"
            )
            moved = browser.evaluate(
                "(document.querySelector('#redrive-tasks td.moved') || {}).textContent"
            )
            return status == "completed" and moved == "1"

        until("the redrive completes, one message moved", completed, limit_s=30)
        shot("07-redrive-completed.png")

        def back():
            browser.open(f"{console}/console")
            return cell("payments", "ready") == "1" and cell("payments-dlq", "ready") == "0"

        until("the message is back in payments", back)
        shot("08-queues-after-redrive.png")

        print("nodes")

        def all_up():
            browser.open(f"{console}/console/nodes")
            return (
                browser.evaluate("document.querySelectorAll('#nodes tbody tr').length") == 3
                and browser.evaluate("document.querySelectorAll('#nodes .up').length") == 3
            )

        until("three members, this one ready and both peers up", all_up)
        shot("09-nodes.png")

        print("readable with JavaScript off")
        browser.call("Emulation.setScriptExecutionDisabled", value=True)
        browser.open(f"{console}/console/queues/payments")
        markup = browser.html()
        assert 'id="queue-name">payments<' in markup, markup
        shot("10-queue-javascript-off.png")
    finally:
        browser.close()
    print("console in Chromium: every check passed")


if __name__ == "__main__":
    main()
