// edgespec's chat page: a conversation with the server's OpenAI endpoint, streamed, and views
// of what speculative decoding did, drawn from the server's own figures (the `edgespec`
// fields of the stream): which tokens the target accepted from the draft, each verify round,
// the answers' figures over the conversation, and plain against speculative decoding.
//
// Plain ES2020, no framework, no build step. The page is served under a strict
// Content-Security-Policy: no inline script or style, so the DOM is built with createElement
// and text is only ever set with textContent (a model's output never becomes markup).
"use strict";

// Violations of the page's Content-Security-Policy, kept for the browser test (the console
// tells people about them too).
window.__cspViolations = [];
document.addEventListener("securitypolicyviolation", (e) => {
  window.__cspViolations.push({ directive: e.violatedDirective, blocked: e.blockedURI,
                                sample: e.sample });
});

const STORE_KEY = "edgespec.chat";      // localStorage: the conversation and the settings
const API_KEY_KEY = "edgespec.apiKey";  // sessionStorage: the API key, for this tab only
const FLOW_ROUNDS = 12;                 // verify rounds the flow view shows
const SVG_NS = "http://www.w3.org/2000/svg";

// The settings' inputs: [name in the saved state, element id, the property that holds it].
const SETTINGS = [
  ["model", "model", "value"], ["system", "system", "value"],
  ["temperature", "temperature", "value"], ["topP", "top-p", "value"],
  ["seed", "seed", "value"], ["maxTokens", "max-tokens", "value"],
  ["speculative", "speculative", "checked"], ["schemaOn", "schema-on", "checked"],
  ["schema", "schema", "value"],
];

const $ = (id) => document.getElementById(id);

// What the page holds: the conversation and the settings (both saved in localStorage), and
// the request in flight. A message is {role, content}; an answer also has tokens ([text,
// fromDraft] pairs), its last rounds, the final figures (stats), and how it ended.
const state = { messages: [], settings: {} };
let inFlight = null;      // the AbortController of the running request, or null

// ---------------------------------------------------------------------------------------
// Small DOM helpers

function el(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
}

function svgEl(tag, attrs, text) {
  const node = document.createElementNS(SVG_NS, tag);
  for (const [name, value] of Object.entries(attrs || {})) node.setAttribute(name, value);
  if (text !== undefined) node.textContent = text;
  return node;
}

function fixed(x, digits) {
  return typeof x === "number" && Number.isFinite(x) ? x.toFixed(digits) : "—";
}

function percent(x) {
  return typeof x === "number" && Number.isFinite(x) ? `${Math.round(x * 100)}%` : "—";
}

// A token's text made visible in a chip: spaces as ␣, line breaks and tabs as symbols, an
// empty piece (part of a character) as ∅.
function visible(text) {
  if (text === "") return "∅";
  return text.replace(/ /g, "␣").replace(/\n/g, "↵").replace(/\t/g, "⇥");
}

function showError(message) {
  const box = $("error");
  box.textContent = message;
  box.hidden = false;
}

function clearError() {
  $("error").hidden = true;
  $("error").textContent = "";
}

// ---------------------------------------------------------------------------------------
// Saving and restoring (localStorage)

function save() {
  try {
    localStorage.setItem(STORE_KEY, JSON.stringify(state));
  } catch (e) {   // full, or storage disabled: the page works on, unsaved
    showError(`the conversation could not be saved in this browser: ${e.message}`);
  }
}

function restore() {
  let saved = null;
  try {
    saved = JSON.parse(localStorage.getItem(STORE_KEY) || "null");
  } catch (e) {
    saved = null;     // unreadable: start afresh
  }
  if (saved && Array.isArray(saved.messages)) state.messages = saved.messages;
  if (saved && saved.settings && typeof saved.settings === "object") {
    state.settings = saved.settings;
  }
  // (The model is chosen once the server has listed its models: loadModels.)
  for (const [name, id, prop] of SETTINGS) {
    if (name in state.settings && name !== "model") $(id)[prop] = state.settings[name];
  }
  $("schema").disabled = !$("schema-on").checked;
}

function readSettingsInputs() {
  for (const [name, id, prop] of SETTINGS) {
    if (name === "model" && !$(id).value) continue;     // not listed yet: keep the saved one
    state.settings[name] = $(id)[prop];
  }
  save();
}

// ---------------------------------------------------------------------------------------
// Talking to the server

class ServerError extends Error {}

// The message of an error response: OpenAI's {"error": {"message"}}, or its text.
async function errorMessage(response) {
  const text = await response.text();
  try {
    const body = JSON.parse(text);
    if (body && body.error) return body.error.message || String(body.error);
  } catch (e) {
    // not JSON: the text itself
  }
  return text || `the server answered ${response.status}`;
}

// The API key form: one request for the key, however many requests got a 401 meanwhile.
let keyWanted = null;     // {promise, resolve} while the form waits for a key

function askForKey(reason) {
  if (!keyWanted) {
    let resolve;
    const promise = new Promise((r) => { resolve = r; });
    keyWanted = { promise, resolve };
    $("key-form").hidden = false;
    $("key").value = "";
    $("key").focus();
  }
  if (reason) showError(reason);
  return keyWanted.promise;
}

function keyGiven(event) {
  event.preventDefault();           // no form submission: the key stays in this page
  const key = $("key").value.trim();
  if (!key || !keyWanted) return;
  sessionStorage.setItem(API_KEY_KEY, key);
  $("key-form").hidden = true;
  clearError();
  const { resolve } = keyWanted;
  keyWanted = null;
  resolve();
}

// `promise`, or an AbortError as soon as `signal` aborts (Stop while the key is asked for).
function unlessAborted(promise, signal) {
  if (!signal) return promise;
  return new Promise((resolve, reject) => {
    const abort = () => reject(new DOMException("stopped", "AbortError"));
    if (signal.aborted) abort();
    signal.addEventListener("abort", abort, { once: true });
    promise.then(resolve, reject);
  });
}

// fetch() with the API key (asked for on a 401, then sent as a bearer token) and JSON
// bodies; a response that is not 2xx throws a ServerError with the server's message.
async function api(path, { body, signal } = {}) {
  for (;;) {
    const headers = {};
    if (body !== undefined) headers["Content-Type"] = "application/json";
    const key = sessionStorage.getItem(API_KEY_KEY);
    if (key) headers.Authorization = `Bearer ${key}`;
    const response = await fetch(path, {
      method: body === undefined ? "GET" : "POST", headers, signal, cache: "no-store",
      body: body === undefined ? undefined : JSON.stringify(body),
    });
    if (response.status !== 401) {
      if (!response.ok) throw new ServerError(await errorMessage(response));
      return response;
    }
    const message = await errorMessage(response);
    sessionStorage.removeItem(API_KEY_KEY);
    // A key that was sent and refused is worth saying; the first 401 just opens the form.
    await unlessAborted(askForKey(key ? message : null), signal);
  }
}

// The JSON payloads of a server-sent event stream, in order, until `data: [DONE]`.
async function* sseData(response) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      buffer += decoder.decode(value, { stream: true });
      // An event ends with a blank line; an incomplete one waits for the next read.
      let end;
      while ((end = buffer.search(/\r?\n\r?\n/)) >= 0) {
        const block = buffer.slice(0, end);
        buffer = buffer.slice(end).replace(/^\r?\n\r?\n/, "");
        const data = block.split(/\r?\n/).filter((line) => line.startsWith("data:"))
          .map((line) => line.slice(5).replace(/^ /, "")).join("\n");
        if (data === "[DONE]") return;
        if (data) yield JSON.parse(data);
      }
    }
  } finally {
    reader.cancel().catch(() => {});   // closes the connection if we stopped early
  }
}

// Streams one chat completion: `onToken(text, fromDraft)` for each token's text,
// `onRound(round)` for each verify round; resolves to {finish, stats} from the final chunk.
// An error event in the stream, or a stream that ends without its final chunk, throws a
// ServerError.
async function streamChat(body, signal, onToken, onRound) {
  const response = await api("/v1/chat/completions", { body: { ...body, stream: true }, signal });
  let final = { finish: null, stats: null };
  for await (const chunk of sseData(response)) {
    if (chunk.error) throw new ServerError(chunk.error.message || String(chunk.error));
    const choice = (chunk.choices || [])[0];
    const extra = chunk.edgespec;
    if (choice && choice.finish_reason) {
      final = { finish: choice.finish_reason, stats: extra || null };
      continue;
    }
    const text = choice && choice.delta && choice.delta.content;
    if (text) onToken(text, Boolean(extra && extra.draft));
    if (extra && extra.round) onRound(extra.round);
  }
  if (!final.finish) throw new ServerError("the stream ended before the answer was complete");
  return final;
}

// ---------------------------------------------------------------------------------------
// The request a conversation makes

class InputError extends Error {}

function number(id, label, { min, max, integer, optional }) {
  const raw = $(id).value.trim();
  if (raw === "" && optional) return null;
  const x = Number(raw);
  if (raw === "" || !Number.isFinite(x) || (integer && !Number.isInteger(x))
      || (min !== undefined && x < min) || (max !== undefined && x > max)) {
    const range = max !== undefined ? ` from ${min} to ${max}` : ` of at least ${min}`;
    throw new InputError(`${label} must be ${integer ? "an integer" : "a number"}` +
                         (min !== undefined ? range : ""));
  }
  return x;
}

// The schema the answer must follow, or null; invalid JSON is an InputError (not sent).
function schema() {
  if (!$("schema-on").checked) return null;
  let value;
  try {
    value = JSON.parse($("schema").value);
  } catch (e) {
    throw new InputError(`the JSON schema is not valid JSON: ${e.message}`);
  }
  if (!value || typeof value !== "object" || Array.isArray(value)) {
    throw new InputError("the JSON schema must be a JSON object");
  }
  return value;
}

// Whether the settings make decoding deterministic: greedy, or sampling with a seed.
function deterministic() {
  const t = Number($("temperature").value);
  return t === 0 || $("seed").value.trim() !== "";
}

// The body of a chat request for `messages` with the page's settings (InputError if one of
// them is invalid). `speculative`: false decodes with the target alone.
function chatBody(messages, speculative) {
  const model = $("model").value;
  if (!model) throw new InputError("no model to ask: the server lists none");
  const body = {
    model,
    messages: messages.map((m) => ({ role: m.role, content: m.content })),
    temperature: number("temperature", "temperature", { min: 0, max: 2 }),
    top_p: number("top-p", "top-p", { min: 0, max: 1 }),
    max_tokens: number("max-tokens", "max tokens", { min: 1, integer: true }),
  };
  const system = $("system").value.trim();
  if (system) body.messages.unshift({ role: "system", content: system });
  const seed = number("seed", "the seed", { integer: true, optional: true });
  if (seed !== null) body.seed = seed;
  const shape = schema();
  if (shape) {
    body.response_format = { type: "json_schema", json_schema: { name: "page", schema: shape } };
  }
  if (!speculative) body.speculative = false;
  return body;
}

// The conversation as the model sees it: questions and the answers that have text.
function history() {
  return state.messages.filter((m) => m.role === "user" || m.content);
}

// ---------------------------------------------------------------------------------------
// The conversation

function tokenSpan(text, fromDraft) {
  return el("span", fromDraft ? "tok draft" : "tok own", text);
}

// What an answer's footer says: its speed and acceptance (the server's), or how it ended.
function answerNote(m) {
  const parts = [];
  const s = m.stats;
  if (s) {
    parts.push(`${fixed(s.tokens_per_second, 1)} tokens/s`);
    if (s.speculative && s.drafted) {
      parts.push(`${s.accepted} of ${s.drafted} drafted tokens accepted`);
    } else if (!s.speculative) {
      parts.push("plain decoding");
    }
    if (typeof s.speedup === "number") parts.push(`≈${s.speedup.toFixed(2)}× plain speed`);
    else if (s.verdict) parts.push(s.verdict);
  }
  if (m.finish === "length") parts.push("stopped at max tokens");
  if (m.stopped) parts.push("stopped");
  if (m.error) parts.push(`failed: ${m.error}`);
  return parts.join(" · ");
}

function messageElement(m) {
  const node = el("div", `msg ${m.role}`);
  node.append(el("div", "role", m.role === "user" ? "you" : "model"));
  const body = el("div", "body");
  if (m.role === "assistant" && Array.isArray(m.tokens)) {
    for (const [text, fromDraft] of m.tokens) body.append(tokenSpan(text, fromDraft));
  } else {
    body.textContent = m.content;
  }
  node.append(body);
  if (m.role === "assistant") node.append(el("div", "meta", answerNote(m)));
  return node;
}

function scrollToEnd() {
  const box = $("messages");
  box.scrollTop = box.scrollHeight;
}

function renderMessages() {
  $("messages").replaceChildren(...state.messages.map(messageElement));
  scrollToEnd();
}

function lastAnswer() {
  for (let i = state.messages.length - 1; i >= 0; i--) {
    if (state.messages[i].role === "assistant") return state.messages[i];
  }
  return null;
}

function renderViews() {
  const m = lastAnswer();
  renderStats(m);
  renderFlow(m ? m.rounds || [] : []);
  renderTrend();
}

function setBusy(controller) {
  inFlight = controller;
  const last = state.messages[state.messages.length - 1];
  $("send").disabled = Boolean(controller);
  $("compare").disabled = Boolean(controller);
  $("stop").disabled = !controller;
  $("regenerate").disabled = Boolean(controller) || !last;
}

// An answer that failed before its first token leaves no message behind, and its question
// goes back into the input box (when that is empty) to be edited and sent again: a question
// the server refused (too long, say) would otherwise be resent with every later one.
function withdraw(failed) {
  const i = state.messages.indexOf(failed);
  if (i < 0) return;        // a new chat has begun meanwhile
  state.messages.splice(i, 1);
  const question = state.messages[i - 1];
  if (i === state.messages.length && question && question.role === "user"
      && !$("input").value.trim()) {
    state.messages.splice(i - 1, 1);
    $("input").value = question.content;
  }
  renderMessages();
}

// Asks for an answer to the conversation as it stands, streaming it into a new message.
async function answer() {
  let body;
  try {
    body = chatBody(history(), $("speculative").checked);
  } catch (e) {
    showError(e.message);
    return;
  }
  const m = { role: "assistant", content: "", tokens: [], rounds: [], stats: null };
  state.messages.push(m);
  const node = messageElement(m);
  node.classList.add("streaming");
  $("messages").append(node);
  const bodyNode = node.querySelector(".body");
  scrollToEnd();
  renderFlow(m.rounds);
  const controller = new AbortController();
  setBusy(controller);
  try {
    const final = await streamChat(body, controller.signal, (text, fromDraft) => {
      m.content += text;
      m.tokens.push([text, fromDraft]);
      bodyNode.append(tokenSpan(text, fromDraft));
      scrollToEnd();
    }, (round) => {
      m.rounds.push(round);
      if (m.rounds.length > FLOW_ROUNDS) m.rounds.shift();
      renderFlow(m.rounds);
    });
    m.finish = final.finish;
    m.stats = final.stats;
  } catch (e) {
    if (e.name === "AbortError") {
      m.stopped = true;
    } else {
      m.error = e.message;
      showError(e.message);
    }
  } finally {
    if (!m.content && !m.stopped && m.error) withdraw(m);
    node.classList.remove("streaming");
    node.querySelector(".meta").textContent = answerNote(m);
    if (inFlight === controller) setBusy(null);    // (a new chat may have started meanwhile)
    save();
    renderViews();
  }
}

function send() {
  if (inFlight) return;
  const text = $("input").value.trim();
  if (!text) return;
  clearError();
  try {
    chatBody([...history(), { role: "user", content: text }], true);   // settings checked first
  } catch (e) {
    showError(e.message);
    return;
  }
  const question = { role: "user", content: text };
  state.messages.push(question);
  $("messages").append(messageElement(question));
  $("input").value = "";
  answer();
}

// Drops the last answer (if the conversation ends with one) and asks again.
function regenerate() {
  if (inFlight || !state.messages.length) return;
  clearError();
  if (state.messages[state.messages.length - 1].role === "assistant") {
    state.messages.pop();
    renderMessages();
  }
  if (state.messages.length) answer();
}

function newChat() {
  if (inFlight) inFlight.abort();
  state.messages = [];
  save();
  clearError();
  renderMessages();
  renderViews();
  $("compare-panel").hidden = true;
  setBusy(null);
  $("input").focus();
}

// ---------------------------------------------------------------------------------------
// The views of speculation

function renderStats(m) {
  const list = $("stats");
  const rows = [];
  const s = m && m.stats;
  if (!s) {
    rows.push(["—", m ? "no figures (the answer did not finish)" : "no answer yet"]);
  } else {
    const threads = s.threads || {};
    rows.push(["decoding", s.speculative ? "speculative (draft + target)"
                                         : "plain (the target alone)"]);
    rows.push(["tokens/s", fixed(s.tokens_per_second, 1)]);
    if (s.speculative) {
      rows.push(["accepted",
                 `${s.accepted} of ${s.drafted} drafted (${percent(s.acceptance_rate)})`]);
      rows.push(["draft length", fixed(s.draft_length, 2)]);
    }
    rows.push(["tokens per target pass", fixed(s.tokens_per_pass, 2)]);
    rows.push(["target passes", String(s.target_passes)]);
    rows.push(["prompt tokens from cache", String(s.prompt_tokens_restored ?? 0)]);
    rows.push(["threads", `target ${threads.target ?? "—"}` +
                          (threads.draft ? `, draft ${threads.draft}` : "")]);
    // As in the terminal: a speed-up only when the server measured one, else its verdict.
    if (typeof s.speedup === "number") {
      rows.push(["speed-up", `≈${s.speedup.toFixed(2)}× plain speed (the server's estimate)`]);
    } else if (s.verdict) {
      rows.push(["verdict", s.verdict]);
    }
  }
  list.replaceChildren(...rows.flatMap(([term, value]) => [el("dt", "", term),
                                                           el("dd", "", value)]));
}

// The flow view: each round's drafted tokens, the accepted ones first and the rejected
// suffix struck out, then the target's own token (the replacement, or the bonus token).
function renderFlow(rounds) {
  const flow = $("flow");
  if (!rounds.length) {
    flow.replaceChildren(el("p", "note", "no verify rounds yet"));
    return;
  }
  flow.replaceChildren(...rounds.map((r) => {
    const row = el("div", "round");
    row.append(el("span", "source", r.source === "none" ? "plain" : r.source));
    if (!r.drafted.length) row.append(el("span", "chip none", "no draft"));
    r.drafted.forEach((text, i) => {
      const taken = i < r.accepted;
      row.append(el(taken ? "span" : "s", taken ? "chip acc" : "chip rej", visible(text)));
    });
    row.append(el("span", "arrow", "→"));
    const allTaken = r.drafted.length > 0 && r.accepted === r.drafted.length;
    const token = el("span", allTaken ? "chip bonus" : "chip fix", visible(r.token));
    token.title = allTaken ? "bonus token: every draft was accepted"
      : r.drafted.length ? "the target's replacement for the first rejected draft"
        : "the target's token (nothing was drafted)";
    row.append(token, el("span", "count", `${r.accepted}/${r.drafted.length}`));
    return row;
  }));
}

// A small line chart of one figure per answer (null: no point), as SVG.
function lineChart(title, values, { max, digits }) {
  const width = 260, height = 56, pad = 6;
  const known = values.filter((v) => typeof v === "number");
  const top = max !== undefined ? max : Math.max(...known, 0) || 1;
  const span = width - 2 * pad;
  const x = (i) => pad + (values.length > 1 ? (i * span) / (values.length - 1) : span / 2);
  const y = (v) => height - pad - (Math.min(v, top) / top) * (height - 2 * pad);
  const chart = svgEl("svg", { viewBox: `0 0 ${width} ${height}`, class: "chart", role: "img",
                               "aria-label": title });
  chart.append(svgEl("line", { x1: pad, y1: height - pad, x2: width - pad, y2: height - pad,
                               class: "axis" }));
  // One line through consecutive points; a missing value breaks it.
  let run = [];
  const flush = () => {
    if (run.length > 1) chart.append(svgEl("polyline", { points: run.join(" "), class: "line" }));
    run = [];
  };
  values.forEach((v, i) => {
    if (typeof v !== "number") {
      flush();
      return;
    }
    run.push(`${x(i).toFixed(1)},${y(v).toFixed(1)}`);
    const dot = svgEl("circle", { cx: x(i).toFixed(1), cy: y(v).toFixed(1), r: 2.5, class: "dot" });
    dot.append(svgEl("title", {}, `answer ${i + 1}: ${v.toFixed(digits)}`));
    chart.append(dot);
  });
  flush();
  let caption = `${title}: —`;
  if (known.length) {
    caption = `${title}: ${known[known.length - 1].toFixed(digits)} ` +
              `(max ${Math.max(...known).toFixed(digits)})`;
  }
  const figure = el("figure", "trend-chart");
  figure.append(el("figcaption", "", caption), chart);
  return figure;
}

// Bars of acceptance by draft position: accepted/tested at each position, summed.
function positionBars(tested, accepted) {
  const width = 260, height = 70, pad = 6, label = 12;
  const n = tested.length;
  const chart = svgEl("svg", { viewBox: `0 0 ${width} ${height}`, class: "chart", role: "img",
                               "aria-label": "acceptance by draft position" });
  const slot = (width - 2 * pad) / Math.max(n, 1);
  for (let i = 0; i < n; i++) {
    const rate = tested[i] ? accepted[i] / tested[i] : 0;
    const h = rate * (height - 2 * pad - label);
    const bar = svgEl("rect", { x: (pad + (i + 0.15) * slot).toFixed(1),
                                y: (height - pad - label - h).toFixed(1),
                                width: (slot * 0.7).toFixed(1), height: h.toFixed(1),
                                class: "bar" });
    bar.append(svgEl("title", {}, `position ${i + 1}: ${accepted[i]} of ${tested[i]} accepted`));
    chart.append(bar);
    chart.append(svgEl("text", { x: (pad + (i + 0.5) * slot).toFixed(1), y: height - pad + 2,
                                 class: "label" },
                       `${i + 1}: ${tested[i] ? percent(rate) : "—"}`));
  }
  const figure = el("figure", "trend-chart");
  figure.append(el("figcaption", "", "acceptance by draft position (this conversation)"), chart);
  return figure;
}

function renderTrend() {
  const stats = state.messages.filter((m) => m.role === "assistant" && m.stats).map((m) => m.stats);
  const trend = $("trend");
  if (!stats.length) {
    trend.replaceChildren(el("p", "note", "one point per answer, once there are answers"));
    return;
  }
  const drafting = (s) => s.speculative && s.drafted > 0;
  const tested = [], accepted = [];
  for (const s of stats) {
    (s.tested_at || []).forEach((t, i) => {
      tested[i] = (tested[i] || 0) + t;
      accepted[i] = (accepted[i] || 0) + ((s.accepted_at || [])[i] || 0);
    });
  }
  trend.replaceChildren(
    lineChart("tokens/s", stats.map((s) => s.tokens_per_second), { digits: 1 }),
    lineChart("acceptance rate", stats.map((s) => (drafting(s) ? s.acceptance_rate : null)),
              { max: 1, digits: 2 }),
    lineChart("tokens per target pass", stats.map((s) => s.tokens_per_pass), { digits: 2 }),
    lineChart("draft length", stats.map((s) => (drafting(s) ? s.draft_length : null)),
              { digits: 2 }),
    tested.length ? positionBars(tested, accepted) : el("p", "note", "no drafts tested yet"),
  );
}

// ---------------------------------------------------------------------------------------
// Comparison: the same prompt decoded plainly, then speculatively

// One streamed run into `textNode`, timed in the page; resolves to {text, seconds, stats}.
async function timedRun(body, textNode, figsNode, signal) {
  textNode.replaceChildren();
  figsNode.textContent = "running…";
  const t0 = performance.now();
  let text = "";
  const final = await streamChat(body, signal, (piece, fromDraft) => {
    text += piece;
    textNode.append(tokenSpan(piece, fromDraft));
  }, () => {});
  const seconds = (performance.now() - t0) / 1000;
  const s = final.stats || {};
  let figs = `${seconds.toFixed(2)} s wall time (measured in this page) · ` +
             `${fixed(s.tokens_per_second, 1)} tokens/s (the server's figure)`;
  if (s.speculative && s.drafted) figs += ` · ${percent(s.acceptance_rate)} of drafts accepted`;
  if (typeof s.speedup === "number") {
    figs += ` · the server's estimate: ≈${s.speedup.toFixed(2)}× plain speed`;
  }
  figsNode.textContent = figs;
  return { text, seconds, stats: final.stats };
}

async function compare() {
  if (inFlight) return;
  clearError();
  const typed = $("input").value.trim();
  let messages = history();
  if (typed) {
    messages = [...messages, { role: "user", content: typed }];
  } else {    // nothing typed: the last question of the conversation, answered afresh
    const last = messages.map((m) => m.role).lastIndexOf("user");
    if (last < 0) {
      showError("type a message to compare plain and speculative decoding on");
      return;
    }
    messages = messages.slice(0, last + 1);
  }
  let plainBody, specBody;
  try {
    plainBody = chatBody(messages, false);
    specBody = chatBody(messages, true);
  } catch (e) {
    showError(e.message);
    return;
  }
  const sure = deterministic();
  $("compare-panel").hidden = false;
  $("compare-note").textContent = sure
    ? "At temperature 0 (or with a seed) the two texts must be identical: speculative " +
      "decoding is lossless."
    : "At this temperature without a seed each run samples afresh, so the texts may differ; " +
      "set temperature 0 or a seed to check that they are identical.";
  const verdict = $("compare-verdict");
  verdict.textContent = "";
  verdict.className = "verdict";
  $("compare-spec").replaceChildren();
  $("compare-spec-figs").textContent = "";
  const controller = new AbortController();
  setBusy(controller);
  try {
    const plain = await timedRun(plainBody, $("compare-plain"), $("compare-plain-figs"),
                                 controller.signal);
    const spec = await timedRun(specBody, $("compare-spec"), $("compare-spec-figs"),
                                controller.signal);
    const same = plain.text === spec.text;
    verdict.textContent = same
      ? "identical: the speculative answer is the plain one, character for character"
      : sure ? "differ: at temperature 0 (or with a seed) they must not; this is a bug " +
               "worth reporting"
        : "differ, as sampling without a seed may";
    verdict.classList.add(same ? "same" : "differ");
  } catch (e) {
    if (e.name === "AbortError") verdict.textContent = "stopped";
    else showError(e.message);
  } finally {
    if (inFlight === controller) setBusy(null);
  }
}

// ---------------------------------------------------------------------------------------
// The model picker

let modelCards = [];

// A model without a chat template gets the messages as plain text (the server says so in
// each card's edgespec.chat_template): the note beside the picker says so too.
function showModelNote() {
  const card = modelCards.find((c) => c.id === $("model").value);
  const format = ((card && card.edgespec) || {}).chat_template || "";
  $("model-note").hidden = !format.startsWith("none");
}

async function loadModels() {
  let cards;
  try {
    cards = (await (await api("/v1/models")).json()).data || [];
  } catch (e) {
    showError(`the models could not be listed: ${e.message}`);
    return;
  }
  const select = $("model");
  select.replaceChildren(...cards.map((card) => {
    const info = card.edgespec || {};
    const option = el("option", "", card.id + (info.loaded ? " (loaded)" : ""));
    option.value = card.id;
    option.title = info.draft ? `draft: ${info.draft}` : "no draft";
    return option;
  }));
  // The saved choice if the server still has it, else a loaded model, else the first.
  const saved = cards.find((c) => c.id === state.settings.model);
  const loaded = cards.find((c) => c.edgespec && c.edgespec.loaded);
  const chosen = saved || loaded || cards[0];
  if (chosen) select.value = chosen.id;
  modelCards = cards;
  showModelNote();
  if (!cards.length) showError("the server lists no models: get one with `edgespec pull`");
}

// ---------------------------------------------------------------------------------------
// Wiring

function start() {
  restore();
  renderMessages();
  renderViews();
  setBusy(null);
  for (const [, id] of SETTINGS) {
    $(id).addEventListener("input", readSettingsInputs);
    $(id).addEventListener("change", readSettingsInputs);
  }
  $("schema-on").addEventListener("change", () => {
    $("schema").disabled = !$("schema-on").checked;
  });
  $("schema").addEventListener("input", () => {
    try {
      JSON.parse($("schema").value);
      $("schema").classList.remove("invalid");
    } catch (e) {
      $("schema").classList.add("invalid");
    }
  });
  $("model").addEventListener("change", showModelNote);
  $("send").addEventListener("click", send);
  $("stop").addEventListener("click", () => { if (inFlight) inFlight.abort(); });
  $("regenerate").addEventListener("click", regenerate);
  $("new-chat").addEventListener("click", newChat);
  $("compare").addEventListener("click", compare);
  $("key-form").addEventListener("submit", keyGiven);
  $("input").addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
      e.preventDefault();
      send();
    }
  });
  loadModels();
}

start();
