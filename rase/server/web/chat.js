// The chat page: conversations kept in localStorage, answers streamed from /v1/chat/completions
// (SSE over fetch, so the API key goes in a header), a stop button that aborts the request
// (the server cancels generation when the stream closes), TTFT and tokens/s per answer.
"use strict";

(function () {
  const $ = (id) => document.getElementById(id);
  const KEY = "rase-chat";
  const DEFAULTS = { temperature: 0.7, top_p: 0.95, top_k: 40, min_p: 0.05, max_tokens: 1024, seed: "" };
  const FIELDS = { temperature: "temperature", top_p: "top-p", top_k: "top-k", min_p: "min-p",
                   max_tokens: "max-tokens", seed: "seed" };

  let state = load();
  let running = null;  // {controller, answer} while an answer streams
  let models = [];     // the last /v1/models list

  function load() {
    let s = null;
    try { s = JSON.parse(localStorage.getItem(KEY)); } catch (e) { s = null; }
    s = s && typeof s === "object" ? s : {};
    s.conversations = Array.isArray(s.conversations) ? s.conversations : [];
    s.settings = Object.assign({ apiKey: "", system: "", model: "" }, DEFAULTS, s.settings || {});
    if (!s.conversations.some((c) => c.id === s.current)) s.current = null;
    return s;
  }

  function save() {
    try {
      localStorage.setItem(KEY, JSON.stringify(state));
    } catch (e) {  // the browser's storage is full (images are large): keep the chats, not their images
      const light = JSON.parse(JSON.stringify(state));
      for (const c of light.conversations) for (const m of c.messages) delete m.images;
      try { localStorage.setItem(KEY, JSON.stringify(light)); } catch (e2) { /* nothing kept */ }
    }
  }

  function current() {
    let c = state.conversations.find((x) => x.id === state.current);
    if (!c) {
      c = { id: Date.now().toString(36) + Math.random().toString(36).slice(2, 6), title: "New chat", messages: [] };
      state.conversations.unshift(c);
      state.current = c.id;
    }
    return c;
  }

  function api(path, options) {
    const headers = { "Content-Type": "application/json" };
    if (state.settings.apiKey) headers.Authorization = "Bearer " + state.settings.apiKey;
    return fetch(path, Object.assign({ headers }, options || {}));
  }

  async function errorOf(res) {
    try {
      const body = await res.json();
      return (body.error && body.error.message) || JSON.stringify(body);
    } catch (e) {
      return res.status + " " + res.statusText;
    }
  }

  function notice(text) {
    const n = $("notice");
    n.textContent = text || "";
    n.hidden = !text;
  }

  // ---- models ----------------------------------------------------------------------------

  async function loadModels() {
    const select = $("model");
    let res;
    try {
      res = await api("v1/models");
    } catch (e) {
      notice("The server did not answer: " + e.message);
      return;
    }
    if (res.status === 401) {
      select.replaceChildren();
      $("settings").open = true;
      notice("This server needs an API key: enter it under Settings (the key given to rase serve --api-key).");
      return;
    }
    if (!res.ok) {
      notice("Could not list models: " + (await errorOf(res)));
      return;
    }
    models = (await res.json()).data || [];
    select.replaceChildren(...models.map((m) => {
      const o = document.createElement("option");
      o.value = m.id;
      o.textContent = m.id;
      o.title = (m.architecture || "") + (m.context_length ? ", context " + m.context_length : "");
      return o;
    }));
    if (!models.length) {
      notice("The store holds no models: add one with `rase model pull` or `rase model import`, then reload.");
      return;
    }
    notice("");
    select.value = models.some((m) => m.id === state.settings.model) ? state.settings.model : models[0].id;
    state.settings.model = select.value;
    showModelInfo();
  }

  function showModelInfo() {
    const m = models.find((x) => x.id === $("model").value);
    $("model-info").textContent = m ? [m.architecture, m.context_length && "ctx " + m.context_length,
                                       seesImages() && "images"].filter(Boolean).join(" · ") : "";
    $("attach-label").hidden = !seesImages();
    if (!seesImages()) setAttached([]);
  }

  // the selected model takes images (/v1/models input_modalities: it has a vision encoder)
  function seesImages() {
    const m = models.find((x) => x.id === $("model").value);
    return !!(m && (m.input_modalities || []).includes("image"));
  }

  // ---- images ----------------------------------------------------------------------------

  let attached = [];  // data URIs of the images the next message carries

  function setAttached(list) {
    attached = list;
    const box = $("attached");
    box.replaceChildren(...attached.map((url, i) => {
      const fig = document.createElement("figure");
      const img = fig.appendChild(document.createElement("img"));
      img.src = url;
      img.alt = "attached image " + (i + 1);
      const rm = fig.appendChild(document.createElement("button"));
      rm.type = "button";
      rm.textContent = "×";
      rm.title = "Remove this image";
      rm.addEventListener("click", () => setAttached(attached.filter((_, j) => j !== i)));
      return fig;
    }));
    box.hidden = !attached.length;
  }

  function readImage(file) {
    return new Promise((resolve, reject) => {
      const r = new FileReader();
      r.onload = () => resolve(r.result);
      r.onerror = () => reject(r.error);
      r.readAsDataURL(file);
    });
  }

  // ---- rendering -------------------------------------------------------------------------

  // "<think>…</think>rest" (Qwen3 and other reasoning models) -> [thinking, answer, closed]
  function splitThinking(text) {
    const m = /^\s*<think>([\s\S]*?)(<\/think>|$)/.exec(text);
    if (!m) return [null, text, true];
    return [m[1].trim(), text.slice(m[0].length).replace(/^\s+/, ""), m[2] !== ""];
  }

  function renderBody(body, message) {
    body.replaceChildren();
    if (message.role !== "assistant") {
      if (message.images && message.images.length) {
        const row = body.appendChild(document.createElement("div"));
        row.className = "images";
        for (const url of message.images) {
          const img = row.appendChild(document.createElement("img"));
          img.className = "thumb";
          img.src = url;
          img.alt = "image";
        }
      }
      body.appendChild(document.createTextNode(message.content));
      return;
    }
    const [thinking, answer, closed] = splitThinking(message.content);
    if (thinking !== null) {
      const d = document.createElement("details");
      d.className = "thinking";
      d.open = !closed;
      const s = document.createElement("summary");
      s.textContent = closed ? "Thought" : "Thinking…";
      d.appendChild(s);
      d.appendChild(window.raseMarkdown.render(thinking));
      body.appendChild(d);
    }
    body.appendChild(window.raseMarkdown.render(answer));
  }

  function statsText(st) {
    if (!st) return "";
    const parts = [];
    if (st.error) parts.push("error: " + st.error);
    if (st.ttft_ms != null) parts.push("TTFT " + Math.round(st.ttft_ms) + " ms");
    if (st.tokens_per_s != null) parts.push(st.tokens_per_s.toFixed(1) + " tokens/s");
    if (st.tokens != null) parts.push(st.tokens + " tokens");
    if (st.cached) parts.push(st.cached + " cached");
    if (st.stopped) parts.push("stopped");
    if (st.model) parts.push(st.model);
    return parts.join(" · ");
  }

  function messageNode(message) {
    const node = document.createElement("article");
    node.className = "msg " + message.role;
    const role = node.appendChild(document.createElement("div"));
    role.className = "role";
    role.textContent = message.role === "user" ? "You" : "Assistant";
    const body = node.appendChild(document.createElement("div"));
    body.className = "body";
    renderBody(body, message);
    const stats = node.appendChild(document.createElement("div"));
    stats.className = "stats";
    stats.textContent = statsText(message.stats);
    return node;
  }

  function renderMessages() {
    const c = state.conversations.find((x) => x.id === state.current);
    const box = $("messages");
    box.replaceChildren(...(c ? c.messages.map(messageNode) : []));
    if (!c || !c.messages.length) {
      const empty = box.appendChild(document.createElement("p"));
      empty.className = "empty";
      empty.textContent = "Ask something. Answers stream from the model selected above.";
    }
    box.scrollTop = box.scrollHeight;
  }

  function renderConversations() {
    const ul = $("conversations");
    ul.replaceChildren(...state.conversations.map((c) => {
      const li = document.createElement("li");
      li.className = c.id === state.current ? "active" : "";
      const open = li.appendChild(document.createElement("button"));
      open.type = "button";
      open.className = "open";
      open.textContent = c.title;
      open.addEventListener("click", () => { if (!running) { state.current = c.id; save(); renderAll(); } });
      const del = li.appendChild(document.createElement("button"));
      del.type = "button";
      del.className = "delete";
      del.title = "Delete this conversation";
      del.textContent = "×";
      del.addEventListener("click", () => {
        if (running) return;
        state.conversations = state.conversations.filter((x) => x.id !== c.id);
        if (state.current === c.id) state.current = null;
        save();
        renderAll();
      });
      return li;
    }));
  }

  function renderAll() {
    renderConversations();
    renderMessages();
  }

  // ---- settings --------------------------------------------------------------------------

  function showSettings() {
    $("api-key").value = state.settings.apiKey;
    $("system").value = state.settings.system;
    for (const [k, id] of Object.entries(FIELDS)) $(id).value = state.settings[k];
  }

  function bindSettings() {
    $("api-key").addEventListener("change", () => {
      state.settings.apiKey = $("api-key").value.trim();
      save();
      loadModels();
    });
    $("system").addEventListener("input", () => { state.settings.system = $("system").value; save(); });
    for (const [k, id] of Object.entries(FIELDS)) {
      $(id).addEventListener("input", () => { state.settings[k] = $(id).value; save(); });
    }
    $("reset-settings").addEventListener("click", () => {
      Object.assign(state.settings, DEFAULTS, { system: "" });
      save();
      showSettings();
    });
  }

  function samplingFields() {  // empty field = the server's default
    const out = {};
    for (const k of Object.keys(FIELDS)) {
      const v = String(state.settings[k]).trim();
      if (v !== "") out[k] = k === "top_k" || k === "max_tokens" || k === "seed" ? parseInt(v, 10) : parseFloat(v);
    }
    return out;
  }

  // ---- sending ---------------------------------------------------------------------------

  // one SSE stream: calls onChunk(parsed) per data event until [DONE]
  async function readStream(res, onChunk) {
    const reader = res.body.getReader();
    const decoder = new TextDecoder();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      buffer += decoder.decode(value, { stream: true });
      let cut;
      while ((cut = buffer.indexOf("\n\n")) >= 0) {
        const event = buffer.slice(0, cut);
        buffer = buffer.slice(cut + 2);
        for (const line of event.split("\n")) {
          if (!line.startsWith("data:")) continue;
          const data = line.slice(5).trim();
          if (data === "[DONE]") return;
          const chunk = JSON.parse(data);
          if (chunk.error) throw new Error(chunk.error.message);
          onChunk(chunk);
        }
      }
    }
  }

  function requestBody(conversation) {
    const messages = [];
    if (state.settings.system.trim()) messages.push({ role: "system", content: state.settings.system });
    for (const m of conversation.messages) {
      if (m.images && m.images.length) {  // OpenAI's parts: the text, then each image
        const parts = m.content ? [{ type: "text", text: m.content }] : [];
        messages.push({ role: m.role, content: parts.concat(m.images.map((url) => ({ type: "image_url",
                                                                                      image_url: { url } }))) });
      } else if (m.content || m.role === "user") messages.push({ role: m.role, content: m.content });
    }
    return Object.assign({ model: $("model").value, messages, stream: true,
                           stream_options: { include_usage: true } }, samplingFields());
  }

  async function send(text) {
    if (running || (!text.trim() && !attached.length)) return;
    if (!$("model").value) {
      notice("No model to ask: " + ($("notice").textContent || "the model list is empty."));
      return;
    }
    notice("");
    const conversation = current();
    if (!conversation.messages.length) conversation.title = text.trim().slice(0, 48) || "Image";
    const user = { role: "user", content: text };
    if (attached.length) user.images = attached;
    setAttached([]);
    conversation.messages.push(user);
    const body = requestBody(conversation);
    const answer = { role: "assistant", content: "", stats: { model: body.model } };
    conversation.messages.push(answer);
    save();
    renderAll();
    const node = $("messages").lastElementChild;
    const controller = new AbortController();
    running = { controller, answer };
    setRunning(true);
    const t0 = performance.now();
    let first = null, last = null, pieces = 0, scheduled = false;
    const repaint = () => {
      scheduled = false;
      const box = $("messages");
      const atBottom = box.scrollHeight - box.scrollTop - box.clientHeight < 40;
      renderBody(node.querySelector(".body"), answer);
      node.querySelector(".stats").textContent = statsText(answer.stats);
      if (atBottom) box.scrollTop = box.scrollHeight;
    };
    const live = (st) => {
      Object.assign(answer.stats, st);
      if (!scheduled) { scheduled = true; requestAnimationFrame(repaint); }
    };
    try {
      const res = await api("v1/chat/completions", { method: "POST", body: JSON.stringify(body),
                                                     signal: controller.signal });
      if (!res.ok) throw new Error(await errorOf(res));
      await readStream(res, (chunk) => {
        const choice = chunk.choices && chunk.choices[0];
        const delta = choice && choice.delta && choice.delta.content;
        if (delta) {
          last = performance.now();
          if (first === null) first = last;
          pieces++;
          answer.content += delta;
          live({ ttft_ms: first - t0, tokens: pieces,
                 tokens_per_s: pieces > 1 ? (pieces - 1) / ((last - first) / 1e3) : null });
        }
        if (chunk.timings && chunk.timings.predicted_per_second != null) {  // the server's own figure
          live({ tokens_per_s: chunk.timings.predicted_per_second });
        }
        if (chunk.usage) {
          const cached = chunk.usage.prompt_tokens_details && chunk.usage.prompt_tokens_details.cached_tokens;
          live({ tokens: chunk.usage.completion_tokens, cached: cached || 0 });
        }
      });
    } catch (e) {
      if (e.name === "AbortError") answer.stats.stopped = true;
      else answer.stats.error = e.message;
    } finally {
      running = null;
      setRunning(false);
      save();
      repaint();
    }
  }

  function setRunning(on) {
    $("send").hidden = on;
    $("stop").hidden = !on;
    $("model").disabled = on;
    document.body.classList.toggle("running", on);
  }

  // ---- wiring ----------------------------------------------------------------------------

  function init() {
    showSettings();
    bindSettings();
    renderAll();
    $("model").addEventListener("change", () => { state.settings.model = $("model").value; save(); showModelInfo(); });
    $("new-chat").addEventListener("click", () => {
      if (running) return;
      state.current = null;
      save();
      renderAll();
      $("input").focus();
    });
    $("composer").addEventListener("submit", (e) => {
      e.preventDefault();
      const text = $("input").value;
      if ((!text.trim() && !attached.length) || running) return;
      $("input").value = "";
      send(text);
    });
    $("attach").addEventListener("change", async () => {
      const files = Array.from($("attach").files || []);
      $("attach").value = "";
      try {
        setAttached(attached.concat(await Promise.all(files.map(readImage))));
      } catch (e) {
        notice("Could not read the image: " + e.message);
      }
    });
    $("input").addEventListener("keydown", (e) => {
      if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
        e.preventDefault();
        $("composer").requestSubmit();
      }
    });
    $("stop").addEventListener("click", () => { if (running) running.controller.abort(); });
    fetch("health").then((r) => (r.ok ? r.json() : null)).then((h) => {
      if (h && h.version) $("version").textContent = h.version;
    }).catch(() => {});
    loadModels();
    $("input").focus();
  }

  document.addEventListener("DOMContentLoaded", init);
})();
