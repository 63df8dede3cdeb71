// Markdown -> DOM for model output. Safe by construction: text only ever becomes text nodes
// (never innerHTML), and a link is made only for http(s) and mailto URLs.
// Blocks: fenced code (an unclosed fence while streaming is code so far), headings, rules,
// quotes, lists (nested by indent), GFM tables, paragraphs. Inline: code, links, autolinks,
// bold, italic, strikethrough.
"use strict";

(function () {
  const FENCE = /^\s{0,3}(`{3,}|~{3,})\s*([^\s`]*)[^`]*$/;
  const HEADING = /^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$/;
  const RULE = /^\s{0,3}([-*_])(\s*\1){2,}\s*$/;
  const QUOTE = /^\s{0,3}>\s?/;
  const ITEM = /^(\s*)([-*+]|\d{1,9}[.)])\s+(.*)$/;
  const TABLE_SEP = /^\s*\|?\s*:?-+:?\s*(\|\s*:?-+:?\s*)*\|?\s*$/;
  const SAFE_URL = /^(https?:\/\/|mailto:)/i;

  function el(tag, cls, text) {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined) e.textContent = text;
    return e;
  }

  // [pattern, build(match, parent)] — the earliest match wins, ties go to the first listed
  const INLINE = [
    [/`([^`]+)`/, (m, p) => p.appendChild(el("code", null, m[1]))],
    [/\[([^\]]+)\]\(\s*<?([^)\s>]+)>?(?:\s+"[^"]*")?\s*\)/, (m, p) => link(m[2], m[1], p)],
    [/\bhttps?:\/\/[^\s<>()\[\]]*[^\s<>()\[\].,;:!?'"]/, (m, p) => link(m[0], m[0], p)],
    [/\*\*(?=\S)([\s\S]*?\S)\*\*|__(?=\S)([\s\S]*?\S)__/, (m, p) => inline(m[1] || m[2], p.appendChild(el("strong")))],
    [/~~(?=\S)([\s\S]*?\S)~~/, (m, p) => inline(m[1], p.appendChild(el("del")))],
    [/\*(?=[^\s*])([\s\S]*?[^\s*])\*|\b_(?=\S)([\s\S]*?\S)_\b/, (m, p) => inline(m[1] || m[2], p.appendChild(el("em")))],
  ];

  function link(url, text, parent) {
    if (!SAFE_URL.test(url)) {  // javascript:, data:, relative: the text alone
      inline(text, parent);
      return;
    }
    const a = el("a");
    a.href = url;
    a.rel = "noopener noreferrer nofollow";
    a.target = "_blank";
    inline(text === url ? "" : text, a);
    if (text === url) a.textContent = url;
    parent.appendChild(a);
  }

  function inline(text, parent) {
    while (text) {
      let best = null;
      for (const [re, build] of INLINE) {
        const m = re.exec(text);
        if (m && (best === null || m.index < best.m.index)) best = { m, build };
      }
      if (best === null) {
        parent.appendChild(document.createTextNode(text));
        return;
      }
      if (best.m.index > 0) parent.appendChild(document.createTextNode(text.slice(0, best.m.index)));
      best.build(best.m, parent);
      text = text.slice(best.m.index + best.m[0].length);
    }
  }

  function lines_inline(lines, parent) {  // soft breaks become <br>, as chat UIs show them
    lines.forEach((line, i) => {
      if (i) parent.appendChild(el("br"));
      inline(line.trim(), parent);
    });
  }

  function codeBlock(lang, body, parent) {
    const wrap = parent.appendChild(el("div", "code-block"));
    const bar = wrap.appendChild(el("div", "code-bar"));
    bar.appendChild(el("span", "code-lang", lang || "text"));
    const copy = bar.appendChild(el("button", "code-copy", "copy"));
    copy.type = "button";
    copy.addEventListener("click", () => {
      if (navigator.clipboard) navigator.clipboard.writeText(body).then(() => { copy.textContent = "copied"; });
    });
    const code = wrap.appendChild(el("pre")).appendChild(el("code", lang ? "language-" + lang : null, body));
    return code;
  }

  function cells(line) {
    let s = line.trim();
    if (s.startsWith("|")) s = s.slice(1);
    if (s.endsWith("|")) s = s.slice(0, -1);
    return s.split("|").map((c) => c.trim());
  }

  function table(head, rows, parent) {
    const t = parent.appendChild(el("table"));
    const tr = t.appendChild(el("thead")).appendChild(el("tr"));
    head.forEach((c) => inline(c, tr.appendChild(el("th"))));
    const body = t.appendChild(el("tbody"));
    rows.forEach((r) => {
      const row = body.appendChild(el("tr"));
      head.forEach((_, i) => inline(r[i] || "", row.appendChild(el("td"))));
    });
  }

  function startsBlock(line, next) {
    return FENCE.test(line) || HEADING.test(line) || RULE.test(line) || QUOTE.test(line) ||
      ITEM.test(line) || (line.includes("|") && next !== undefined && TABLE_SEP.test(next));
  }

  function list(lines, i, parent) {  // -> index after the list
    const first = ITEM.exec(lines[i]);
    const indent = first[1].length;
    const ordered = /\d/.test(first[2]);
    const node = parent.appendChild(el(ordered ? "ol" : "ul"));
    if (ordered && parseInt(first[2], 10) !== 1) node.start = parseInt(first[2], 10);
    while (i < lines.length) {
      const m = ITEM.exec(lines[i]);
      if (!m || m[1].length < indent || /\d/.test(m[2]) !== ordered) break;
      if (m[1].length > indent) break;
      const body = [m[3]];
      i++;
      // continuation: indented lines (a nested list among them), or a lazy line of text
      while (i < lines.length && lines[i].trim() !== "") {
        const sub = ITEM.exec(lines[i]);
        if (sub && sub[1].length <= indent) break;
        if (!sub && startsBlock(lines[i], lines[i + 1]) && !/^\s/.test(lines[i])) break;
        body.push(lines[i].slice(Math.min(indent + 2, lines[i].search(/\S|$/))));
        i++;
      }
      blocks(body, node.appendChild(el("li")), true);
      if (i < lines.length && lines[i].trim() === "" && i + 1 < lines.length) {
        const again = ITEM.exec(lines[i + 1]);
        if (again && again[1].length === indent && /\d/.test(again[2]) === ordered) i++;
      }
    }
    return i;
  }

  function blocks(lines, parent, tight) {
    let i = 0;
    while (i < lines.length) {
      const line = lines[i];
      let m;
      if (line.trim() === "") {
        i++;
      } else if ((m = FENCE.exec(line))) {
        const close = new RegExp("^\\s{0,3}" + m[1][0] + "{" + m[1].length + ",}\\s*$");
        const body = [];
        for (i++; i < lines.length && !close.test(lines[i]); i++) body.push(lines[i]);
        i++;
        codeBlock(m[2], body.join("\n"), parent);
      } else if ((m = HEADING.exec(line))) {
        inline(m[2], parent.appendChild(el("h" + m[1].length)));
        i++;
      } else if (RULE.test(line)) {
        parent.appendChild(el("hr"));
        i++;
      } else if (QUOTE.test(line)) {
        const body = [];
        for (; i < lines.length && lines[i].trim() !== "" ; i++) body.push(lines[i].replace(QUOTE, ""));
        blocks(body, parent.appendChild(el("blockquote")));
      } else if (ITEM.test(line)) {
        i = list(lines, i, parent);
      } else if (line.includes("|") && i + 1 < lines.length && TABLE_SEP.test(lines[i + 1])) {
        const head = cells(line);
        const rows = [];
        for (i += 2; i < lines.length && lines[i].includes("|"); i++) rows.push(cells(lines[i]));
        table(head, rows, parent);
      } else {
        const para = [line];
        for (i++; i < lines.length && lines[i].trim() !== "" && !startsBlock(lines[i], lines[i + 1]); i++) {
          para.push(lines[i]);
        }
        lines_inline(para, tight ? parent : parent.appendChild(el("p")));
        if (tight && i < lines.length) parent.appendChild(el("br"));
      }
    }
  }

  // text -> DocumentFragment
  function render(text) {
    const frag = document.createDocumentFragment();
    blocks(String(text).replace(/\r\n?/g, "\n").split("\n"), frag);
    return frag;
  }

  window.raseMarkdown = { render };
})();
