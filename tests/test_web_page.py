"""The chat page `edgespec serve` answers ``GET /`` with.

First, without a browser or a model: the page and its files are served with their media types
and a strict Content-Security-Policy, need no API key but pass the Host check, and hold no
inline script or style. Then in headless Chromium (driven by selenium) against a real server
with the SmolLM2 pair and an API key: the page asks for the key, notes a model without a chat
template (Gemma-3-270M, from the models folder) beside the picker, streams an answer with the
draft's accepted tokens marked, shows the figures and the verify rounds, keeps the
conversation over a reload, and compares plain with speculative decoding at temperature 0
(identical texts). The browser must log no error, the page must cause no CSP violation (a
negative control proves violations are caught) and make no request to another origin.

The browser tests run in file order on one page (one server and one browser for the module):
each goes on from where the one before it left the page.
"""

from __future__ import annotations

import html.parser
import json
import os
import re
import shutil
import time
from importlib import resources
from pathlib import Path

import pytest
from conftest import require_tools
from starlette.testclient import TestClient

from edgespec.server.app import create_app
from edgespec.server.models import ModelManager
from edgespec.server.page import CSP
from server_helpers import ServerProcess, post

KEY = "sk-web-0123456789"
SERVED = "SmolLM2-135M-Instruct.F32"
QUESTION = "Count from 1 to 30, separated by commas."
FOLLOW_UP = "Now count from 30 down to 1."
MAX_TOKENS = 48
WEB_FILES = {"index.html": "text/html", "app.js": "text/javascript", "style.css": "text/css",
             "icon.svg": "image/svg+xml"}


# ---------------------------------------------------------------------------------------------
# The routes, without a browser or a model


def app_client(api_key: str | None = None, host: str = "127.0.0.1") -> TestClient:
    """The app over a manager with no models (nothing here generates), as ``host`` calls it."""
    manager = ModelManager(lambda: {}, lambda entry, n_ctx: None)
    return TestClient(create_app(manager=manager, n_ctx=512, api_key=api_key),
                      base_url=f"http://{host}:8000")


def test_the_page_and_its_files_are_served_with_a_strict_policy():
    client = app_client()
    for path, media in [("/", "text/html"), *((f"/web/{n}", m) for n, m in WEB_FILES.items())]:
        r = client.get(path)
        assert r.status_code == 200, path
        assert r.headers["content-type"].split(";")[0] == media, path
        assert r.headers["content-security-policy"] == CSP
        assert r.headers["x-content-type-options"] == "nosniff"
        assert r.headers["referrer-policy"] == "no-referrer"
    assert client.get("/").content == client.get("/web/index.html").content
    assert client.head("/").status_code == 200
    for policy in ("default-src 'none'", "script-src 'self'", "style-src 'self'",
                   "connect-src 'self'", "frame-ancestors 'none'", "form-action 'none'"):
        assert policy in CSP


def test_only_the_pages_own_files_are_served():
    client = app_client()
    for path in ("/web/", "/web/missing.js", "/web/page.py", "/web/..%2Fpage.py",
                 "/web/..%2F..%2F__init__.py", "/web/.hidden.css", "/web/index.htm",
                 "/web/web/app.js"):
        assert client.get(path).status_code == 404, path


def test_the_page_needs_no_key_but_the_api_does():
    client = app_client(api_key=KEY)
    for path in ("/", "/web/app.js", "/health"):
        assert client.get(path).status_code == 200, path
    assert client.get("/v1/models").status_code == 401
    assert client.get("/v1/models", headers={"Authorization": f"Bearer {KEY}"}).status_code \
        == 200


def test_the_host_check_covers_the_page():
    """Without a key, a page reached through another name (DNS rebinding) is not served."""
    for path in ("/", "/web/app.js", "/health"):
        assert app_client(host="rebound.example").get(path).status_code == 400, path
        assert app_client(host="localhost").get(path).status_code == 200, path


class _Markup(html.parser.HTMLParser):
    """The tags, attributes and inline text of scripts and styles of an HTML file."""

    def __init__(self):
        super().__init__()
        self.tags: list[tuple[str, dict]] = []
        self.inline: list[str] = []
        self._in: str | None = None

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))
        self._in = tag if tag in ("script", "style") else None

    def handle_endtag(self, tag):
        self._in = None

    def handle_data(self, data):
        if self._in and data.strip():
            self.inline.append(data)


def test_the_page_holds_no_inline_code_and_names_only_its_own_files():
    web = resources.files("edgespec.server").joinpath("web")
    assert {p.name for p in web.iterdir()} == set(WEB_FILES)      # package data: web/*
    markup = _Markup()
    markup.feed(web.joinpath("index.html").read_text())
    assert not markup.inline
    assert all(tag != "style" for tag, _ in markup.tags)
    for tag, attrs in markup.tags:
        assert "style" not in attrs and not any(a.startswith("on") for a in attrs), tag
    linked = {attrs.get("src") or attrs.get("href") for tag, attrs in markup.tags
              if tag in ("script", "link")}
    assert linked == {f"/web/{n}" for n in ("app.js", "style.css", "icon.svg")}
    script = web.joinpath("app.js").read_text()
    assert script.lstrip().startswith("//") and '"use strict";' in script
    for unsafe in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(",
                   "new Function", "prompt(", "setAttribute(\"style\""):
        assert unsafe not in script, unsafe
    # No address but this server's: the one URL in the script is the SVG namespace.
    assert re.findall(r"https?://[^\s\"'`]+", script) == ["http://www.w3.org/2000/svg"]
    style = web.joinpath("style.css").read_text()
    assert "@import" not in style and "url(" not in style


# ---------------------------------------------------------------------------------------------
# In a browser, against a real server


@pytest.fixture(scope="module")
def server(smollm2_f32_path, smollm2_q4_path):
    s = ServerProcess("--api-key", KEY, "--target", smollm2_f32_path, "--draft", smollm2_q4_path,
                      "--ctx-size", 1024, "--draft-max", 4)
    yield s
    rc = s.stop()
    assert rc in (0, 130), s.log()
    assert "Traceback" not in s.log(), s.log()


# Recorded before the page's own script runs, from outside the page (a CDP script is not
# subject to the page's policy): the page's own record could miss a violation or be wrong.
CSP_LISTENER = """
window.__cspSeen = [];
document.addEventListener("securitypolicyviolation",
    (e) => window.__cspSeen.push(e.violatedDirective + " " + e.blockedURI));
"""


@pytest.fixture(scope="module")
def driver():
    """Headless Chromium, its console and its network events logged. No sandbox: the tests
    run as root in CI (and in containers without user namespaces)."""
    require_tools("chromium", "chromedriver", packages="chromium chromium-driver")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium")
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1400,1000", "--no-first-run", "--disable-extensions",
                "--disable-background-networking", "--disable-sync",
                "--disable-component-update", "--disable-default-apps"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"performance": "ALL", "browser": "ALL"})
    d = webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=options)
    d.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": CSP_LISTENER})
    yield d
    d.quit()


def origin(server) -> str:
    return f"http://127.0.0.1:{server.port}"


def wait_for(what: str, predicate, timeout: float = 60.0, page=None):
    """predicate()'s first true value, polled; fails after ``timeout`` seconds, or as soon as
    ``page`` (a driver) shows an error."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if page is not None and shown(page, "#error"):
            pytest.fail(f"the page shows an error: {css(page, '#error').text}", pytrace=False)
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}", pytrace=False)
        time.sleep(0.02)


def css(driver, selector: str):
    return driver.find_element("css selector", selector)


def csss(driver, selector: str) -> list:
    return driver.find_elements("css selector", selector)


def shown(driver, selector: str) -> bool:
    return css(driver, selector).is_displayed()


def set_value(driver, selector: str, value: str) -> None:
    """Types ``value`` into a field, as a person would (the input events fire)."""
    field = css(driver, selector)
    field.clear()
    field.send_keys(value)


# The last answer as the page shows it: its tokens' text, how many came from the draft,
# whether it is still streaming, and the rounds the flow view shows.
LAST_ANSWER = """
const answers = document.querySelectorAll("#messages .msg.assistant");
const m = answers[answers.length - 1];
if (!m) return null;
const toks = [...m.querySelectorAll(".tok")];
return {text: toks.map((t) => t.textContent).join(""),
        draft: m.querySelectorAll(".tok.draft").length,
        own: m.querySelectorAll(".tok.own").length,
        streaming: m.classList.contains("streaming"),
        rounds: document.querySelectorAll("#flow .round").length,
        busy: document.getElementById("send").disabled};
"""


def last_answer(driver) -> dict | None:
    return driver.execute_script(LAST_ANSWER)


def assert_no_csp_violations(driver) -> None:
    assert driver.execute_script("return window.__cspSeen") == []
    assert driver.execute_script("return window.__cspViolations") == []


def screenshot(driver, name: str) -> None:
    folder = os.environ.get("EDGESPEC_SCREENSHOTS")
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        assert driver.save_screenshot(str(Path(folder) / name))


def test_the_page_asks_for_the_key_then_lists_the_models(driver, server):
    driver.get(origin(server) + "/")
    assert driver.title == "edgespec"
    wait_for("the key form after the 401", lambda: shown(driver, "#key-form"))
    assert not csss(driver, "#model option")
    set_value(driver, "#key", "sk-wrong")
    css(driver, "#key-form button").click()
    wait_for("the refusal shown", lambda: "incorrect API key" in css(driver, "#error").text)
    assert shown(driver, "#key-form")
    set_value(driver, "#key", KEY)
    css(driver, "#key-form button").click()
    options = wait_for("the models listed", lambda: csss(driver, "#model option"))
    assert not shown(driver, "#key-form") and not shown(driver, "#error")
    names = [o.get_attribute("value") for o in options]
    assert SERVED in names
    assert "(loaded)" in css(driver, f"#model option[value='{SERVED}']").text
    assert driver.execute_script("return sessionStorage.getItem('edgespec.apiKey')") == KEY
    assert_no_csp_violations(driver)


def test_a_model_without_a_chat_template_has_a_note_beside_the_picker(driver, server):
    """Gemma-3-270M (a base model in the models folder) gets its messages as plain text: the
    page says so while it is chosen (from its card's edgespec.chat_template)."""
    from selenium.webdriver.support.select import Select
    picker = Select(css(driver, "#model"))
    assert not shown(driver, "#model-note")                 # SmolLM2 has its own template
    base = "gemma-3-270m.Q4_K_M"
    assert base in [o.get_attribute("value") for o in picker.options]
    picker.select_by_value(base)
    wait_for("the note", lambda: shown(driver, "#model-note"))
    assert "no chat template" in css(driver, "#model-note").text
    assert "plain text" in css(driver, "#model-note").text
    screenshot(driver, "web-model-note.png")
    picker.select_by_value(SERVED)
    wait_for("the note hidden", lambda: not shown(driver, "#model-note"))
    assert_no_csp_violations(driver)


def test_an_answer_streams_with_the_drafts_tokens_marked(driver, server):
    css(driver, f"#model option[value='{SERVED}']").click()
    set_value(driver, "#temperature", "0")
    set_value(driver, "#max-tokens", str(MAX_TOKENS))
    set_value(driver, "#input", QUESTION)
    css(driver, "#send").click()
    # The answer grows while it streams (several partial texts are seen before its end), and
    # the flow view follows it.
    seen, rounds = set(), set()

    def done():
        a = last_answer(driver)
        if a and a["streaming"]:
            seen.add(a["text"])
            rounds.add(a["rounds"])
        return a if a and not a["streaming"] and not a["busy"] else None
    answer = wait_for("the answer's end", done, page=driver)
    assert len({t for t in seen if t}) >= 3, seen
    assert max(rounds) > 0, rounds
    assert not shown(driver, "#error"), css(driver, "#error").text
    assert answer["text"] and answer["draft"] >= 1 and answer["own"] >= 1, answer
    # The page's text is the server's answer, chunk for chunk (no piece lost or doubled).
    status, whole = post(server.port, "/v1/chat/completions", {
        "model": SERVED, "messages": [{"role": "user", "content": QUESTION}],
        "temperature": 0, "top_p": 0.95, "max_tokens": MAX_TOKENS}, key=KEY)
    assert status == 200 and whole["choices"][0]["message"]["content"] == answer["text"]

    stats = css(driver, "#stats").text
    assert "tokens/s" in stats and "accepted" in stats and "draft length" in stats, stats
    rounds = csss(driver, "#flow .round")
    assert 1 <= len(rounds) <= 12
    assert csss(driver, "#flow .chip.acc") and csss(driver, "#flow .chip.fix, #flow .chip.bonus")
    assert len(csss(driver, "#trend svg")) == 5          # four figures and the positions' bars
    assert csss(driver, "#trend rect.bar")
    assert "accepted" in css(driver, "#legend").text
    assert not css(driver, "#regenerate").get_attribute("disabled")
    assert_no_csp_violations(driver)
    screenshot(driver, "web-chat.png")


def test_a_reload_keeps_the_conversation_and_the_key(driver, server):
    before = last_answer(driver)
    flow = len(csss(driver, "#flow .round"))
    driver.refresh()
    after = wait_for("the conversation restored", lambda: last_answer(driver))
    assert after["text"] == before["text"] and after["draft"] == before["draft"]
    assert [m.text for m in csss(driver, "#messages .msg.user .body")] == [QUESTION]
    assert css(driver, "#temperature").get_attribute("value") == "0"
    assert css(driver, "#max-tokens").get_attribute("value") == str(MAX_TOKENS)
    assert len(csss(driver, "#flow .round")) == flow and "tokens/s" in css(driver, "#stats").text
    wait_for("the models listed", lambda: csss(driver, "#model option"))
    assert not shown(driver, "#key-form")                 # the key is asked for once a tab
    assert css(driver, "#model").get_attribute("value") == SERVED
    assert_no_csp_violations(driver)


def test_plain_and_speculative_decoding_give_the_same_text_at_temperature_0(driver, server):
    set_value(driver, "#input", FOLLOW_UP)
    css(driver, "#compare").click()
    verdict = wait_for("the comparison's verdict", lambda: css(driver, "#compare-verdict").text,
                       page=driver)
    assert not shown(driver, "#error"), css(driver, "#error").text
    assert "identical" in verdict, verdict
    plain, spec = css(driver, "#compare-plain").text, css(driver, "#compare-spec").text
    assert plain and plain == spec
    assert csss(driver, "#compare-spec .tok.draft")
    assert not csss(driver, "#compare-plain .tok.draft")       # the target alone drafts nothing
    for side in ("plain", "spec"):
        figs = css(driver, f"#compare-{side}-figs").text
        assert "s wall time" in figs and "tokens/s" in figs, figs
    assert "must be identical" in css(driver, "#compare-note").text
    assert len(csss(driver, "#messages .msg")) == 2       # the comparison is not the chat's
    assert_no_csp_violations(driver)
    screenshot(driver, "web-compare.png")


def answer_count(driver) -> int:
    return len(csss(driver, "#messages .msg.assistant"))


def wait_for_answer(driver) -> dict:
    return wait_for("the answer's end", lambda: (a := last_answer(driver)) and not a["busy"]
                    and not a["streaming"] and a, page=driver)


def test_regenerate_replaces_the_last_answer(driver, server):
    before = last_answer(driver)
    css(driver, "#input").clear()
    css(driver, "#regenerate").click()
    after = wait_for_answer(driver)
    assert answer_count(driver) == 1 and after["text"] == before["text"]   # temperature 0


NAME = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12}},
        "required": ["name"], "additionalProperties": False}


def test_a_json_schema_shapes_the_answer_and_invalid_json_is_not_sent(driver, server):
    css(driver, ".settings summary").click()
    css(driver, "#schema-on").click()
    set_value(driver, "#schema", '{"type": "object", ')
    set_value(driver, "#input", "Who are you?")
    css(driver, "#send").click()
    wait_for("the schema refused", lambda: shown(driver, "#error"))
    assert "not valid JSON" in css(driver, "#error").text
    assert answer_count(driver) == 1 and css(driver, "#input").get_attribute("value")
    set_value(driver, "#schema", json.dumps(NAME))
    css(driver, "#send").click()
    answer = wait_for_answer(driver)
    assert answer_count(driver) == 2
    assert set(json.loads(answer["text"])) == {"name"}, answer["text"]
    css(driver, "#schema-on").click()


def test_a_refused_request_shows_the_servers_message(driver, server):
    """A question longer than the context: the server's 400 is shown, and the question goes
    back into the input box rather than staying in the conversation."""
    messages = len(csss(driver, "#messages .msg"))
    too_long = "lighthouse " * 1500
    driver.execute_script("arguments[0].value = arguments[1]", css(driver, "#input"), too_long)
    css(driver, "#send").click()
    wait_for("the refusal", lambda: shown(driver, "#error")
             and not css(driver, "#send").get_attribute("disabled"))
    assert "token" in css(driver, "#error").text, css(driver, "#error").text
    assert len(csss(driver, "#messages .msg")) == messages
    assert css(driver, "#input").get_attribute("value") == too_long.strip()


def test_stop_keeps_the_answer_so_far_and_new_chat_clears(driver, server):
    set_value(driver, "#max-tokens", "400")
    set_value(driver, "#input", "Write a long story about a lighthouse.")
    css(driver, "#send").click()
    wait_for("some text", lambda: (a := last_answer(driver)) and a["streaming"]
             and len(a["text"]) > 20, page=driver)
    css(driver, "#stop").click()
    stopped = wait_for_answer(driver)
    assert stopped["text"] and answer_count(driver) == 3
    assert "stopped" in csss(driver, "#messages .msg.assistant .meta")[-1].text
    assert css(driver, "#stop").get_attribute("disabled")
    set_value(driver, "#max-tokens", str(MAX_TOKENS))
    css(driver, "#new-chat").click()
    assert not csss(driver, "#messages .msg") and "no answer yet" in css(driver, "#stats").text
    stored = json.loads(driver.execute_script("return localStorage.getItem('edgespec.chat')"))
    assert stored["messages"] == [] and stored["settings"]["maxTokens"] == str(MAX_TOKENS)
    assert_no_csp_violations(driver)


def test_the_browser_logged_no_error_and_asked_only_this_server(driver, server):
    # The only errors: the resources the server refused on purpose (the two 401s the key form
    # answers, with no key and with a wrong one, and the question too long for the context).
    severe = [e["message"] for e in driver.get_log("browser") if e["level"] == "SEVERE"]
    base = origin(server) + "/"
    refused = [f"{base}v1/models - Failed to load resource: the server responded with a "
               "status of 401 (Unauthorized)"] * 2 + [
               f"{base}v1/chat/completions - Failed to load resource: the server responded "
               "with a status of 400 (Bad Request)"]
    assert severe == refused, severe
    urls = []
    for entry in driver.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        if message["method"] == "Network.requestWillBeSent":
            urls.append(message["params"]["request"]["url"])
    assert {base, base + "web/app.js", base + "web/style.css", base + "v1/models",
            base + "v1/chat/completions"} <= set(urls), urls
    assert all(u.startswith(base) for u in urls), [u for u in urls if not u.startswith(base)]


def test_a_policy_violation_is_caught(driver, server):
    """The negative control: inline script and style are refused and recorded, so that the
    empty records above mean something."""
    driver.execute_script("""
        const script = document.createElement("script");
        script.textContent = "window.__inlineRan = true;";
        document.head.append(script);
        const style = document.createElement("style");
        style.textContent = "body { outline: 3px solid red; }";
        document.head.append(style);
        const div = document.createElement("div");
        div.setAttribute("style", "color: red");
        document.body.append(div);
        fetch("http://192.0.2.1/").catch(() => {});
    """)
    seen = wait_for("the violations recorded",
                    lambda: (v := driver.execute_script("return window.__cspSeen"))
                    and len(v) >= 4 and v)
    directives = {v.split()[0] for v in seen}
    assert {"script-src-elem", "style-src-elem", "style-src-attr", "connect-src"} <= directives
    assert len(driver.execute_script("return window.__cspViolations")) == len(seen)
    assert driver.execute_script("return window.__inlineRan") is None
    severe = [e["message"] for e in driver.get_log("browser") if e["level"] == "SEVERE"]
    assert any("Content Security Policy" in m for m in severe), severe
