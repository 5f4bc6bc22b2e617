// writ console: the page. Plain JavaScript, no framework, no build step.
// The token arrives once in the address's fragment (/#token=…, which no
// browser sends to a server, so it reaches no access log), is kept in this
// tab's sessionStorage and removed from the address. Fetches send it as
// `Authorization: Bearer`; the event stream (EventSource sends no header) is
// opened with a one-use ticket the page asks for with it before each connect.
// Everything shown is built with textContent, never as HTML. A module (strict, deferred): drafts.js keeps
// what the operator typed on escalation cards.
import { DraftBook, baseToSend, decidable } from "./drafts.js";

(() => {
  const KEY = "writ-console-token";
  const fragment = new URLSearchParams(location.hash.slice(1));
  const params = new URLSearchParams(location.search);
  // An old link (?token=…) still opens the page, but its token went to the server's and any proxy's logs.
  const fromQuery = params.get("token");
  let token = fragment.get("token") || fromQuery;
  if (token) {
    sessionStorage.setItem(KEY, token);
    fragment.delete("token");
    params.delete("token");
    const rest = params.toString();
    const hash = fragment.toString();
    history.replaceState(null, "", location.pathname + (rest ? `?${rest}` : "") + (hash ? `#${hash}` : ""));
  } else {
    token = sessionStorage.getItem(KEY);
  }

  const $ = (id) => document.getElementById(id);
  /** An element: h("td", {class: "x", dataset: {a: 1}}, "text", child, …). */
  function h(tag, attrs, ...children) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === undefined || v === null || v === false) continue;
      if (k === "class") e.className = v;
      else if (k === "dataset") Object.assign(e.dataset, v);
      else if (k === "text") e.textContent = v;
      else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
      else e.setAttribute(k, v === true ? "" : String(v));
    }
    for (const c of children.flat()) {
      if (c === undefined || c === null || c === false) continue;
      e.append(c instanceof Node ? c : document.createTextNode(String(c)));
    }
    return e;
  }

  const view = {
    session: null,
    snap: null,
    filters: { agent: "", tool: "", record: "" },
    /** escalation id → {pending, answer, error} of decisions sent from this page */
    decisions: new Map(),
    /** dead letter `partition:offset` → {pending, sentTo, error} of send-backs from this page */
    redrives: new Map(),
    /** the dead letters' reason filter ("" any), and whether a bulk send back is on its way */
    dlqReason: "",
    bulkPending: false,
    /** dead letters the operator ticked (`partition:offset`): the bulk button sends these when any is shown */
    dlqPicked: new Set(),
    /** escalation id → its card, kept while the escalation is shown */
    cards: new Map(),
    /** what the operator typed on the cards and has not sent, by escalation id (outlives a card built again) */
    drafts: new DraftBook(),
  };

  function age(iso) {
    const s = Math.max(0, Math.round((Date.now() - Date.parse(iso)) / 1000));
    if (!Number.isFinite(s)) return "?";
    if (s < 120) return `${s} s`;
    if (s < 7200) return `${Math.round(s / 60)} min`;
    if (s < 172800) return `${Math.round(s / 3600)} h`;
    return `${Math.round(s / 86400)} d`;
  }
  const when = (iso) => h("span", { class: "age", dataset: { at: iso }, title: iso }, `${age(iso)} ago`);
  const short = (id) => (typeof id === "string" && id.length > 12 ? `${id.slice(0, 8)}…` : String(id ?? ""));
  const pre = (clipped) => h("pre", { class: clipped && clipped.truncated ? "json truncated" : "json" }, clipped ? clipped.json : "null");

  // ---- filters (client-side) ----
  function matches(item) {
    const f = view.filters;
    const has = (value, want) => !want || (typeof value === "string" && value.toLowerCase().includes(want.toLowerCase()));
    return has(item.agent, f.agent) && has(item.tool, f.tool) && has(item.entity, f.record);
  }
  function filtering() {
    const f = view.filters;
    return Boolean(f.agent || f.tool || f.record);
  }
  for (const name of ["agent", "tool", "record"]) {
    $(`f-${name}`).addEventListener("input", (ev) => {
      view.filters[name] = ev.target.value.trim();
      renderFiltered();
    });
  }
  $("f-clear").addEventListener("click", () => {
    for (const name of ["agent", "tool", "record"]) {
      $(`f-${name}`).value = "";
      view.filters[name] = "";
    }
    renderFiltered();
  });
  $("filters").addEventListener("submit", (ev) => ev.preventDefault());

  // ---- sections ----
  function renderCounts() {
    const s = view.snap;
    if (!s) return;
    const c = s.counts;
    const tile = (label, value, cls) => h("div", { class: `tile ${cls || ""}`, dataset: { count: label } }, h("span", { class: "v" }, String(value)), h("span", { class: "l" }, label));
    $("counts").replaceChildren(
      tile("applied", c.applied, "applied"),
      tile("conflict", c.conflict, "conflict"),
      tile("rejected", c.rejected, "rejected"),
      tile("escalated", c.escalated, "escalated"),
      tile("in flight", c.inFlight, "inflight"),
      // Open ones past the page's limit are counted, not kept: the operator must know more wait (writ escalations list).
      tile("open escalations", c.escalationsDropped > 0 ? `${c.escalationsOpen} (+${c.escalationsDropped} not kept)` : c.escalationsOpen, c.escalationsOpen + c.escalationsDropped > 0 ? "alert" : ""),
      tile("dead letters", c.deadLetters, c.deadLetters > 0 ? "alert" : ""),
      tile("lag", s.lag ? s.lag.total : "–", s.lag && s.lag.total > 0 ? "warn" : ""),
    );
    escalationsHeading();
    $("n-inflight").textContent = c.inFlightDropped > 0 ? `${c.inFlight} (+${c.inFlightDropped} dropped)` : String(c.inFlight);
  }

  /**
   * The ACL check of the console's start: a banner unless only the owners may write the ledger, writ.human,
   * writ.dlq and the reply topics (then what those topics hold may be forged by any client, or by the named ones).
   */
  function renderTrust() {
    const t = view.snap && view.snap.trust;
    const b = $("trust");
    const show = Boolean(t) && t.status !== "ok";
    b.hidden = !show;
    if (!show) {
      b.replaceChildren();
      return;
    }
    b.dataset.status = t.status;
    b.dataset.reason = t.reason;
    const title =
      t.reason === "no_authorizer"
        ? "Writers are not restricted: this Kafka cluster has no authorizer."
        : t.reason === "foreign_writers"
          ? `Principals other than the owners may write trusted topics: ${[...new Set(t.topics.flatMap((x) => x.foreign))].join(", ")}.`
          : t.reason === "owners_cannot_write"
            ? `No ACL lets the owners write: ${t.topics.filter((x) => !x.ownersMayWrite).map((x) => x.topic).join(", ")}.`
            : "Who may write the trusted topics was not checked.";
    const forged =
      t.status === "warning" ? " Escalations, replies and dead letters shown here may be forged; the page marks the ones it can tell apart (reported, contested)." : "";
    const message = `${t.message.charAt(0).toUpperCase()}${t.message.slice(1)}.${forged}`;
    b.replaceChildren(h("strong", {}, title), message, " ", h("code", { class: "mono" }, `reason: ${t.reason}`));
  }

  function renderTopics() {
    const t = view.snap && view.snap.topics;
    if (!t) return;
    $("topics").textContent = `${t.intents} · ${t.human} · ${t.dlq} · ${t.replies.length} reply topic${t.replies.length === 1 ? "" : "s"} (${t.replyPrefix}*)`;
  }

  function note(list, shown, id) {
    $(id).textContent = filtering() && shown !== list.length ? `${shown} of ${list.length}` : String(list.length);
  }

  function renderInFlight() {
    const list = view.snap.inFlight;
    const rows = list.filter(matches).map((i) =>
      h(
        "tr",
        { dataset: { intentId: i.intentId } },
        h("td", {}, when(i.createdAt)),
        h("td", {}, i.agent),
        h("td", {}, i.kind === "resolution" ? `${i.tool} (resolution: ${i.decision})` : i.tool),
        h("td", {}, i.entity),
        h("td", { class: "mono" }, i.baseVersion ?? ""),
        h("td", { class: "mono", title: `${i.intentId} at ${i.where.topic}[${i.where.partition}]@${i.where.offset}` }, short(i.intentId)),
      ),
    );
    $("inflight").replaceChildren(...(rows.length ? rows : [h("tr", {}, h("td", { colspan: 6, class: "empty" }, "Nothing in flight."))]));
  }

  function replyDetail(r) {
    switch (r.status) {
      case "applied":
        return `version ${r.version} via ${r.via}${r.resolvedBy ? `, resolved by ${r.resolvedBy}` : ""}`;
      case "conflict":
        return `cycle ${r.cycle}: record at ${r.version}`;
      case "rejected":
        return `${r.reason}${r.resolvedBy ? ` by ${r.resolvedBy}` : ""}: ${r.message}`;
      case "escalated":
        return `${r.reason}: ${r.message}`;
      default:
        return "";
    }
  }

  function renderReplies() {
    const list = view.snap.replies;
    const shown = list.filter(matches);
    note(list, shown.length, "n-replies");
    const rows = shown.map((r) =>
      h(
        "tr",
        { dataset: { status: r.status, intentId: r.intentId } },
        h("td", {}, when(r.at)),
        h("td", {}, h("span", { class: `badge ${r.status}` }, r.status), r.duplicate ? h("span", { class: "badge dup" }, "duplicate") : null),
        h("td", { title: r.agentFromTopic ? "from the reply topic's name" : null }, r.agent ?? ""),
        h("td", {}, r.tool ?? ""),
        h("td", {}, r.entity ?? ""),
        h("td", { class: "detail" }, replyDetail(r)),
      ),
    );
    $("replies").replaceChildren(...(rows.length ? rows : [h("tr", {}, h("td", { colspan: 6, class: "empty" }, "No replies."))]));
  }

  function renderConflicts() {
    const list = view.snap.conflicts;
    const shown = list.filter(matches);
    note(list, shown.length, "n-conflicts");
    const cards = shown.map((c) =>
      h(
        "article",
        { class: "conflict", dataset: { intentId: c.intentId, entity: c.entity } },
        h("header", {}, h("span", { class: "badge conflict" }, `conflict · cycle ${c.cycle}`), h("b", {}, c.entity), ` ${c.tool ?? "?"} · ${c.agent ?? "?"} · `, when(c.at)),
        h("p", { class: "msg" }, c.message),
        h(
          "div",
          { class: "cols" },
          h("div", { class: "current" }, h("h4", {}, "current ", h("code", {}, c.current.version)), pre(c.current.state)),
          h("div", { class: "your-change" }, h("h4", {}, "your_change", c.baseVersion ? h("span", { class: "muted" }, " (written from ", h("code", {}, c.baseVersion), ")") : null), pre(c.yourChange)),
        ),
      ),
    );
    $("conflicts").replaceChildren(...(cards.length ? cards : [h("p", { class: "empty" }, "No conflicts.")]));
  }

  /** A dead letter's key in `view.redrives`: its place in writ.dlq (`where`, or a send-back answer's). */
  const letterKey = (at) => `${at.partition}:${at.offset}`;

  /** The dead letters the table shows: the record filter (on the key; they name no agent or tool) and the reason. */
  function shownDeadLetters() {
    const f = view.filters.record.toLowerCase();
    const reason = view.dlqReason;
    return view.snap.deadLetters.filter((d) => (!f || (d.key ?? "").toLowerCase().includes(f)) && (!reason || d.reason === reason));
  }

  /** Whether this page may send `d` back: the operator's, not sent back yet, from the intents topic, not on its way. */
  function sendable(d) {
    const r = view.redrives.get(letterKey(d.where));
    return Boolean(canDecide() && view.session && !d.sentBack && d.source.topic === view.session.topics.intents && !(r && r.pending));
  }

  function renderDeadLetters() {
    const list = view.snap.deadLetters;
    // the reasons present (and the one chosen, while none of it is kept any more)
    const select = $("dlq-reason");
    const reasons = [...new Set([...list.map((d) => d.reason), ...(view.dlqReason ? [view.dlqReason] : [])])].sort();
    const have = [...select.options].slice(1).map((o) => o.value);
    if (have.join("\n") !== reasons.join("\n")) select.replaceChildren(h("option", { value: "" }, "any reason"), ...reasons.map((r) => h("option", { value: r }, r)));
    select.value = view.dlqReason;
    const shown = shownDeadLetters();
    $("n-dlq").textContent = shown.length !== list.length ? `${shown.length} of ${list.length}` : String(list.length);
    const rows = shown.map((d) =>
      h(
        "tr",
        { dataset: { reason: d.reason, dlqPartition: String(d.where.partition), dlqOffset: d.where.offset, sentBack: d.sentBack ? "true" : "false" } },
        h("td", { class: "pick" }, pickView(d)),
        h("td", {}, when(d.at)),
        h("td", {}, h("span", { class: "badge rejected" }, d.reason)),
        h("td", { class: "mono" }, `${d.source.topic}[${d.source.partition}]@${d.source.offset}`),
        h("td", { class: "mono" }, d.key ?? "null"),
        h("td", { title: `sha256 ${d.sha256}` }, `${d.originalBytes}${d.truncated ? " (truncated)" : ""}`),
        h("td", { class: "detail" }, d.message),
        h("td", { class: "redrive" }, ...redriveView(d)),
      ),
    );
    $("dead-letters").replaceChildren(...(rows.length ? rows : [h("tr", {}, h("td", { colspan: 8, class: "empty" }, "No dead letters."))]));
    // the operator's bulk send back: the ticked ones shown, or with none ticked every shown one this page may send
    const button = $("dlq-send-shown");
    const { chosen, scope } = bulkChoice();
    const n = chosen.length;
    button.hidden = !canDecide() || (n === 0 && !view.bulkPending);
    button.disabled = n === 0 || view.bulkPending;
    button.dataset.count = String(n);
    button.dataset.scope = scope;
    button.textContent = view.bulkPending ? "Sending…" : `Send back ${n} ${scope}`;
    button.title =
      scope === "selected"
        ? "Send the ticked dead letters shown back to the intents topic, once their cause is fixed; a record ticked twice goes once"
        : "Send every dead letter shown (not sent back yet) back to the intents topic, once their cause is fixed; a record shown twice goes once";
  }

  /**
   * What the bulk button sends: the ticked dead letters the table shows and this page may send ("selected"), or,
   * with none of them ticked, every shown one it may send ("shown"). A ticked one the filters hide is not sent.
   */
  function bulkChoice() {
    const sendableShown = shownDeadLetters().filter(sendable);
    const picked = sendableShown.filter((d) => view.dlqPicked.has(letterKey(d.where)));
    return picked.length > 0 ? { chosen: picked, scope: "selected" } : { chosen: sendableShown, scope: "shown" };
  }

  /** A dead letter's first cell: (operator) a box that ticks it for the bulk button, while it may be sent. */
  function pickView(d) {
    if (!sendable(d)) return null;
    const k = letterKey(d.where);
    return h("input", {
      type: "checkbox",
      dataset: { action: "pick" },
      "aria-label": `select the dead letter at partition ${d.where.partition}, offset ${d.where.offset}`,
      checked: view.dlqPicked.has(k),
      onchange: (ev) => {
        if (ev.target.checked) view.dlqPicked.add(k);
        else view.dlqPicked.delete(k);
        renderDeadLetters();
      },
    });
  }

  /**
   * A dead letter's last cell: where it was sent back, or (operator) a button that sends it back to the intents
   * topic, where it passes admission again: one whose cause remains comes back as a new dead letter.
   */
  function redriveView(d) {
    const k = letterKey(d.where);
    const r = view.redrives.get(k);
    const out = [];
    if (d.sentBack) out.push(h("span", { class: "ok sent-back" }, `sent back → ${d.sentBack.topic}[${d.sentBack.partition}]@${d.sentBack.offset}`));
    else if (canDecide() && view.session && d.source.topic === view.session.topics.intents) {
      const title = d.truncated ? "Send the original back to the intents topic (read from its source offset), once its cause is fixed" : "Send it back to the intents topic, once its cause is fixed";
      out.push(h("button", { type: "button", dataset: { action: "redrive" }, disabled: Boolean(r && r.pending), title, onclick: () => redrive(d) }, r && r.pending ? "Sending…" : "Send back"));
    }
    // a refusal no longer holds once the dead letter shows sent back (from another page, the CLI or the API)
    if (r && r.error && !d.sentBack) out.push(h("span", { class: "error redrive-error", dataset: { reason: r.reason || "" } }, ` ${r.error}`));
    return out;
  }

  /** A dead letter the console answered for: shown at once (the stream brings the same a moment later). */
  function replaceDeadLetter(item) {
    if (!item || !view.snap) return;
    view.snap.deadLetters = view.snap.deadLetters.map((x) => (x.where.partition === item.where.partition && x.where.offset === item.where.offset ? item : x));
  }

  /**
   * Sends the ticked dead letters shown, or every shown one this page may send (`bulkChoice`), at most 200 per
   * request; says how many went and why others did not. What it sends is no longer ticked.
   */
  async function redriveShown() {
    const { chosen } = bulkChoice();
    if (chosen.length === 0 || view.bulkPending) return;
    view.bulkPending = true;
    for (const d of chosen) {
      view.redrives.set(letterKey(d.where), { pending: true });
      view.dlqPicked.delete(letterKey(d.where));
    }
    $("dlq-bulk").textContent = "";
    renderDeadLetters();
    let sent = 0;
    const notSent = new Map();
    for (let at = 0; at < chosen.length; at += 200) {
      const part = chosen.slice(at, at + 200);
      try {
        const res = await fetch("/api/dead-letters/redrive", {
          method: "POST",
          headers: { "content-type": "application/json", authorization: `Bearer ${token}` },
          body: JSON.stringify({ deadLetters: part.map((d) => ({ partition: d.where.partition, offset: d.where.offset })) }),
        });
        const json = await res.json().catch(() => ({}));
        if (!res.ok || !Array.isArray(json.results)) throw new Error(`${res.status}: ${json.error ?? res.statusText}`);
        for (const r of json.results) {
          const k = letterKey(r);
          if (r.outcome === "sent") {
            sent++;
            view.redrives.set(k, { sentTo: r.sentTo });
          } else {
            notSent.set(r.outcome, (notSent.get(r.outcome) ?? 0) + 1);
            view.redrives.set(k, { error: r.error ?? r.outcome, reason: r.outcome });
          }
          replaceDeadLetter(r.deadLetter);
        }
      } catch (err) {
        for (const d of part) view.redrives.set(letterKey(d.where), { error: `could not send it back: ${err && err.message ? err.message : err}`, reason: "request_failed" });
        notSent.set("request_failed", (notSent.get("request_failed") ?? 0) + part.length);
      }
    }
    view.bulkPending = false;
    const not = [...notSent.values()].reduce((a, b) => a + b, 0);
    const bulk = $("dlq-bulk");
    bulk.dataset.sent = String(sent);
    bulk.dataset.notSent = String(not);
    bulk.textContent = `${sent} sent back${not ? `, ${not} not (${[...notSent].map(([why, n]) => `${why} ${n}`).join(", ")})` : ""}`;
    renderDeadLetters();
  }
  $("dlq-send-shown").addEventListener("click", () => void redriveShown());
  $("dlq-reason").addEventListener("change", (ev) => {
    view.dlqReason = ev.target.value;
    renderDeadLetters();
  });

  async function redrive(d) {
    const k = letterKey(d.where);
    view.redrives.set(k, { pending: true });
    renderDeadLetters();
    let result;
    try {
      const res = await fetch(`/api/dead-letters/${d.where.partition}/${d.where.offset}/redrive`, {
        method: "POST",
        headers: { "content-type": "application/json", authorization: `Bearer ${token}` },
        body: "{}",
      });
      const json = await res.json().catch(() => ({}));
      result = res.ok ? { sentTo: json.sentTo } : { error: `${res.status}: ${json.error ?? res.statusText}`, reason: json.reason };
      if (res.ok) replaceDeadLetter(json.deadLetter);
    } catch (err) {
      result = { error: `could not reach the console: ${err && err.message ? err.message : err}` };
    }
    view.redrives.set(k, result);
    renderDeadLetters();
  }

  function renderLag() {
    const lag = view.snap.lag;
    if (!lag) {
      $("lag").replaceChildren(h("tr", {}, h("td", { colspan: 5, class: "empty" }, "Not measured yet.")));
      return;
    }
    $("n-lag").textContent = String(lag.total);
    $("lag-hint").textContent = lag.error ? `Could not measure: ${lag.error}` : `Group ${lag.group} on ${lag.topic}: committed offset against the partition's end, ${age(lag.at)} ago.`;
    const max = Math.max(1, ...lag.partitions.map((p) => p.lag));
    const rows = lag.partitions.map((p) =>
      h(
        "tr",
        { dataset: { partition: p.partition } },
        h("td", {}, String(p.partition)),
        h("td", { class: "mono" }, p.committed ?? "none"),
        h("td", { class: "mono", title: `last stable ${p.lastStable}, log start ${p.logStart}` }, p.end),
        h("td", { class: p.lag > 0 ? "mono warn" : "mono" }, String(p.lag)),
        h("td", { class: "bar" }, p.lag > 0 ? h("span", { dataset: { w: Math.max(2, Math.round((100 * p.lag) / max)) } }) : null),
      ),
    );
    $("lag").replaceChildren(...(rows.length ? rows : [h("tr", {}, h("td", { colspan: 5, class: "empty" }, "No partitions."))]));
    // widths through the CSSOM (the page's policy allows no inline style attributes)
    for (const span of $("lag").querySelectorAll(".bar span")) span.style.width = `${span.dataset.w}%`;
  }

  // ---- escalations: cards kept by id; what the operator typed is kept by id too (view.drafts), so it survives
  // updates and a card built again, and goes with its escalation ----
  const canDecide = () => view.session && view.session.role === "operator";

  /** The escalation as the page's state has it now (a card's handlers outlive the item the card was made from). */
  const itemOf = (id) => (view.snap ? view.snap.escalations.find((x) => x.escalationId === id) : undefined);

  /** A card's "record now" column: the record as its owner last read it (the escalation's, or an answer's since). */
  function currentView(e) {
    return [h("h4", {}, "record now ", e.current ? h("code", { class: "version" }, e.current.version) : h("span", { class: "muted" }, "(not read)")), e.current ? pre(e.current.state) : null].filter(Boolean);
  }

  function escalationCard(e) {
    const id = e.escalationId;
    /** The operator changed a field: kept in the drafts, against the escalation as it is now. */
    const typed = (field, value) => {
      const now = itemOf(id);
      if (now) view.drafts.edit(now, field, value);
    };
    const base = h("input", { name: "baseVersion", class: "mono", placeholder: "the version to apply on", "aria-label": "base version", oninput: () => typed("base", base.value) });
    const message = h("input", { name: "message", placeholder: "a message to the agent (optional)", maxlength: 2000, "aria-label": "message to the agent", oninput: () => typed("message", message.value) });
    const delta = deltaField(e, typed);
    const stale = staleNotice(id, delta);
    const parts = { base, message, delta, stale };
    const button = (action, label, cls) => h("button", { type: "button", class: cls, dataset: { action }, onclick: () => decide(id, action, parts) }, label);
    const form = canDecide()
      ? h(
          "div",
          { class: "decide" },
          stale.box,
          h("label", {}, "Apply on version ", base),
          h("label", { class: "grow" }, "Message ", message),
          button("apply", "Apply", "primary"),
          button("discard", "Discard", "danger"),
          button("return", "Return to agent", ""),
          delta.box,
        )
      : null;
    const card = h(
      "article",
      { class: "escalation", dataset: { escalationId: id, entity: e.entity, currentVersion: e.current ? e.current.version : "" } },
      h("header", {}, h("span", { class: "badge status" }), h("span", { class: "badge escalated" }, e.reason), h("b", {}, e.entity), ` ${e.tool} · ${e.agent} · ${e.cycles} conflict cycle${e.cycles === 1 ? "" : "s"} · `, when(e.at)),
      h("p", { class: "msg" }, e.message),
      // shown when another record claims this id (it can come after the card is made)
      h("p", { class: "warning contested", dataset: { contested: "true" } }, "Two different records claim this escalation id: one is forged. Decide from the ledger (writ escalations list, writ escalations resolve), not from this page."),
      e.mayHaveWritten
        ? h("p", { class: "warning", dataset: { mayHaveWritten: "true" } }, "The write may already have reached the system of record: check the record before deciding. Apply reconciles first and never writes it twice.")
        : null,
      h(
        "div",
        { class: "cols" },
        h("div", { class: "current" }, ...currentView(e)),
        h(
          "div",
          { class: "your-change" },
          h("h4", {}, "the agent's change ", h("span", { class: "muted" }, "(from ", h("code", {}, e.baseVersion), ")")),
          pre(e.change),
          h("details", {}, h("summary", {}, "params"), pre(e.params)),
        ),
      ),
      h("p", { class: "outcome" }),
      form,
      h("div", { class: "answer", "aria-live": "polite" }),
      h("p", { class: "ids muted" }, `escalation ${e.escalationId} · intent ${e.intentId} · key ${short(e.intentKey)}`),
    );
    if (form) {
      showFields(card, e);
      delta.box.open = view.drafts.fields(e).open;
    }
    return card;
  }

  /** The card's fields as the drafts say (the operator's, else the prefill); a field already so is left alone (its caret too). */
  function showFields(card, e) {
    const f = view.drafts.fields(e);
    const set = (selector, prop, value) => {
      const el = card.querySelector(selector);
      if (el && el[prop] !== value) el[prop] = value;
    };
    set('input[name="baseVersion"]', "value", f.base);
    set('textarea[name="delta"]', "value", f.delta);
    set('input[name="useDelta"]', "checked", f.use);
    set('input[name="message"]', "value", f.message);
  }

  /**
   * Shown when the record the card shows is no longer the one the operator's change was written against (an owner
   * answered with the record as it is now): the change stays as typed, and Apply waits until the operator keeps
   * it (to apply on the record now) or starts again from the record now.
   */
  function staleNotice(id, field) {
    const text = h("span", { class: "text" });
    const decided = (how) => {
      const e = itemOf(id);
      if (!e) return;
      view.drafts[how](e);
      showDeltaProblem(field, "");
      renderEscalations();
    };
    const keep = h("button", { type: "button", dataset: { draft: "keep" }, onclick: () => decided("keep") }, "Keep my change");
    const reset = h("button", { type: "button", dataset: { draft: "reset" }, onclick: () => decided("reset") }, "Start again from the record now");
    const box = h("div", { class: "warning draft-stale", role: "alert", hidden: true }, text, " ", keep, " ", reset);
    return { box, text, keep };
  }

  function showStale(card, e) {
    const box = card.querySelector(".draft-stale");
    if (!box) return;
    const st = view.drafts.stale(e);
    box.hidden = !st;
    if (!st) return;
    const at = (v) => v || "(not read)";
    box.querySelector(".text").textContent = `The record changed since you edited this change: it was written against the record at ${at(st.was)}; it is now ${at(st.now)} (shown above). Your change, base version and message are kept as you left them, and Apply waits: check the change against the record now, then keep it or start again.`;
    box.querySelector('[data-draft="keep"]').textContent = st.now ? `Keep my change, to apply on ${st.now}` : "Keep my change";
  }

  /**
   * The change to write with Apply, for a tool declared without a delta function (the owner cannot rebuild its
   * change on the record now and answers resolution_delta_required): a JSON Patch, prefilled with the agent's own
   * change (when the page has it whole) to edit against the record shown. Sent only while "send" is ticked
   * (editing ticks it): for a tool with a delta function a given delta must be the one it derives.
   */
  function deltaField(e, typed) {
    const text = h("textarea", {
      name: "delta",
      class: "mono",
      rows: 10,
      spellcheck: "false",
      autocomplete: "off",
      placeholder: '[{"op": "replace", "path": "/tags", "value": ["vip"]}]',
      "aria-label": "change to write with Apply (JSON Patch)",
    });
    const use = h("input", { type: "checkbox", name: "useDelta", "aria-label": "send this change with Apply" });
    const problem = h("p", { class: "error delta-error", role: "alert", hidden: true });
    const required = h("p", { class: "warning delta-required", hidden: true }, "The record's owner cannot rebuild this tool's change on the record as it is now (the tool has no delta function): write the change here, against the record shown, and Apply again.");
    const box = h(
      "details",
      { class: "delta" },
      h("summary", {}, "Change to write with Apply (JSON Patch)"),
      h(
        "p",
        { class: "hint" },
        "For a tool without a delta function, whose change the owner cannot rebuild (it answers resolution_delta_required). Prefilled with the agent's change",
        e.change && e.change.truncated ? " (too long to show whole here: write it, or use writ escalations resolve --delta-file)" : "",
        "; edit it against the record now. Leave it unsent for a tool with a delta function: a given change must be the one the tool derives. The owner writes only what the tool may touch (its allowedPaths, which this page does not know): a change beyond them is refused, nothing written.",
      ),
      required,
      h("label", {}, use, " send this change with Apply"),
      text,
      problem,
    );
    text.addEventListener("input", () => {
      use.checked = true;
      typed("delta", text.value);
      typed("use", true);
      showDeltaProblem(field, "");
    });
    use.addEventListener("change", () => {
      typed("use", use.checked);
      showDeltaProblem(field, "");
    });
    box.addEventListener("toggle", () => typed("open", box.open));
    const field = { box, text, use, problem, required, typed };
    return field;
  }

  function showDeltaProblem(field, text) {
    field.problem.textContent = text;
    field.problem.hidden = !text;
    if (text) field.text.setAttribute("aria-invalid", "true");
    else field.text.removeAttribute("aria-invalid");
  }

  const POINTER = /^(\/([^~/]|~[01])*)*$/;
  const OP_FIELDS = { add: ["path", "value"], remove: ["path"], replace: ["path", "value"], move: ["from", "path"], copy: ["from", "path"], test: ["path", "value"] };

  /** Levels of nesting of a JSON value (a scalar 0, [] 1), counted no further than `limit` + 1. */
  function depthOf(value, limit) {
    let max = 0;
    const stack = [[value, 0]];
    while (stack.length) {
      const [v, d0] = stack.pop();
      if (v === null || typeof v !== "object") continue;
      const d = d0 + 1;
      if (d > limit) return limit + 1;
      if (d > max) max = d;
      for (const c of Array.isArray(v) ? v : Object.values(v)) if (c !== null && typeof c === "object") stack.push([c, d]);
    }
    return max;
  }

  /**
   * The delta typed, as the console's endpoint takes it (src/console/delta.ts: its size and depth bounds, then an
   * array of 1 to 256 RFC 6902 operations, as src/schemas/common.ts's JsonPatch): {delta} or {error}.
   */
  function parseDelta(raw) {
    const limits = (view.session && view.session.delta) || { maxBytes: 65536, maxDepth: 31 };
    if (!raw.trim()) return { error: "The change is empty: give a JSON Patch, an array of operations such as [{\"op\": \"replace\", \"path\": \"/tags\", \"value\": [\"vip\"]}]." };
    let value;
    try {
      value = JSON.parse(raw);
    } catch (err) {
      return { error: `The change is not JSON: ${err && err.message ? err.message : err}` };
    }
    const bytes = new TextEncoder().encode(JSON.stringify(value)).length;
    if (bytes > limits.maxBytes) return { error: `The change is ${bytes} bytes as JSON; the console sends at most ${limits.maxBytes} (larger: writ escalations resolve --delta-file).` };
    if (depthOf(value, limits.maxDepth) > limits.maxDepth) return { error: `The change is nested deeper than ${limits.maxDepth} levels, which owners refuse.` };
    const not = (what) => ({ error: `The change is not a JSON Patch (RFC 6902): ${what}.` });
    if (!Array.isArray(value)) return not("it must be an array of operations, such as [{\"op\": \"replace\", \"path\": \"/tags\", \"value\": [\"vip\"]}]");
    if (value.length === 0 || value.length > 256) return not(`it must hold 1 to 256 operations (it holds ${value.length})`);
    for (let i = 0; i < value.length; i++) {
      const op = value[i];
      if (op === null || typeof op !== "object" || Array.isArray(op)) return not(`[${i}] is not an object`);
      const fields = Object.hasOwn(OP_FIELDS, op.op) ? OP_FIELDS[op.op] : null;
      if (!fields) return not(`[${i}].op must be one of ${Object.keys(OP_FIELDS).join(", ")}`);
      for (const f of fields) if (!Object.hasOwn(op, f)) return not(`[${i}] (${op.op}) needs "${f}"`);
      for (const k of Object.keys(op)) if (k !== "op" && !fields.includes(k)) return not(`[${i}] (${op.op}) takes no "${k}"`);
      for (const f of ["path", "from"]) {
        if (fields.includes(f) && (typeof op[f] !== "string" || !POINTER.test(op[f]))) return not(`[${i}].${f} must be a JSON Pointer (RFC 6901), such as "/tags" or "" for the whole record`);
      }
    }
    return { delta: value };
  }

  /** After the owner answered resolution_delta_required: the field, open and focused, says why. */
  function pointAtDelta(field) {
    field.box.open = true;
    field.required.hidden = false;
    field.use.checked = true;
    field.typed("use", true);
    field.text.focus();
  }

  function outcomeText(e) {
    const r = e.resolution;
    if (r && r.from === "reply") {
      const what = { applied: "applied", discarded: "discarded", returned: "returned to the agent" }[r.outcome] ?? "not open";
      return `Reported resolved by ${r.by ?? "?"} (${what}; from a reply; the owner decides).`;
    }
    if (e.status === "open") return e.lastAttempt ? `Still open. Last decision (${e.lastAttempt.decision} by ${e.lastAttempt.by ?? "?"}): ${e.lastAttempt.status}${e.lastAttempt.reason ? ` ${e.lastAttempt.reason}` : ""}${e.lastAttempt.message ? `: ${e.lastAttempt.message}` : ""}` : "";
    if (!r) return "Resolved.";
    const by = r.by ? ` by ${r.by}` : "";
    switch (r.outcome) {
      case "applied":
        return `Resolved: applied${by}${r.version ? ` (record now at ${r.version})` : ""}.`;
      case "discarded":
        return `Resolved: discarded${by}${r.message ? `: ${r.message}` : ""}.`;
      case "returned":
        return `Resolved: returned to the agent${by}${r.message ? `: ${r.message}` : ""}.`;
      default:
        return `Not open: ${r.message ?? "the owner says this escalation is not open"}.`;
    }
  }

  function answerView(d) {
    if (!d) return [];
    if (d.pending) return [h("span", { class: "pending" }, `Sending ${d.decision}… waiting for the record's owner.`)];
    if (d.error) return [h("span", { class: "error" }, d.error)];
    const a = d.answer;
    const closed = a.status === "applied" || (a.status === "rejected" && (a.reason === "escalation_discarded" || a.reason === "returned_by_operator"));
    const needsDelta = a.status === "rejected" && a.reason === "resolution_delta_required";
    const line =
      a.status === "applied"
        ? `applied at ${a.version} (via ${a.via})`
        : a.status === "rejected"
          ? `${a.reason}: ${a.message}`
          : a.status === "unknown"
            ? `no answer before the deadline: ${a.message}`
            : `${a.status}${a.message ? `: ${a.message}` : ""}`;
    return [
      h("span", { class: closed ? "ok" : "error", dataset: { answerStatus: a.status, answerReason: a.reason ?? "" } }, `Owner's answer: ${line}`),
      needsDelta ? h("span", { class: "delta-required-answer" }, " Nothing was written. Give the change to write in “Change to write with Apply” below and Apply again.") : null,
      // as the console gives it: its fields bounded, its details (a refusal's record, as large and deep as the owner read it) clipped JSON
      a.details ? h("details", {}, h("summary", {}, "the answer's details"), pre(a.details)) : null,
    ].filter(Boolean);
  }

  /** The escalations' heading: from the list and the counts (either may change alone). */
  function escalationsHeading() {
    const list = view.snap.escalations;
    if (!list) return;
    const shown = list.filter(matches).length;
    const open = list.filter((e) => e.status === "open").length;
    const dropped = view.snap.counts.escalationsDropped;
    const notKept = dropped > 0 ? `; ${dropped} more open not kept here (list full): writ escalations list` : "";
    const miskeyed = view.snap.counts.escalationsMiskeyed;
    const ignored = miskeyed > 0 ? `; ${miskeyed} record${miskeyed === 1 ? "" : "s"} on ${view.snap.topics.human} ignored (not keyed by their record)` : "";
    $("n-escalations").textContent = `${open} open, ${list.length - open} resolved${filtering() && shown !== list.length ? ` (${shown} shown)` : ""}${notKept}${ignored}`;
  }

  /** The card field that has the page's focus, with its caret, selection and scroll; null when focus is elsewhere. */
  function focusedField() {
    const el = document.activeElement;
    const card = el && el.name ? el.closest("#escalations article.escalation") : null;
    if (!card) return null;
    const text = typeof el.selectionStart === "number";
    return { id: card.dataset.escalationId, name: el.name, start: text ? el.selectionStart : null, end: text ? el.selectionEnd : null, direction: text ? el.selectionDirection : null, scrollTop: el.scrollTop };
  }

  /** Focus back where it was, when a card was moved or built again under it (and nothing else took it since). */
  function restoreFocus(was) {
    if (!was || (document.activeElement && document.activeElement !== document.body)) return;
    const card = view.cards.get(was.id);
    const el = card && card.isConnected ? [...card.querySelectorAll("[name]")].find((x) => x.name === was.name) : undefined;
    if (!el || el.closest("[hidden]") || el.disabled) return;
    el.focus({ preventScroll: true });
    if (was.start !== null && typeof el.setSelectionRange === "function") el.setSelectionRange(was.start, was.end, was.direction ?? "none");
    el.scrollTop = was.scrollTop;
  }

  function renderEscalations() {
    const list = view.snap.escalations;
    const shown = list.filter(matches);
    escalationsHeading();
    const focused = focusedField();
    // a draft goes with its escalation: none for one no longer listed or no longer decidable here (hidden by a filter: kept)
    view.drafts.prune(list);
    const box = $("escalations");
    const keep = new Set(shown.map((e) => e.escalationId));
    for (const [id, card] of view.cards) {
      if (!keep.has(id)) {
        card.remove();
        view.cards.delete(id);
      }
    }
    box.querySelector(":scope > .empty")?.remove();
    let previous = null;
    for (const e of shown) {
      let card = view.cards.get(e.escalationId);
      if (!card) {
        card = escalationCard(e);
        view.cards.set(e.escalationId, card);
      }
      card.dataset.status = e.status;
      card.dataset.contested = e.contested ? "true" : "false";
      card.querySelector(".warning.contested").hidden = !e.contested;
      card.querySelector(".badge.status").textContent = e.resolution && e.resolution.from === "reply" ? "reported resolved" : e.status;
      card.querySelector(".badge.status").className = `badge status ${e.status}`;
      card.querySelector(".outcome").textContent = outcomeText(e);
      const version = e.current ? e.current.version : "";
      if (card.dataset.currentVersion !== version) {
        card.querySelector(".current").replaceChildren(...currentView(e));
        card.dataset.currentVersion = version;
      }
      const form = card.querySelector(".decide");
      const d = view.decisions.get(e.escalationId);
      if (form) {
        form.hidden = !decidable(e);
        for (const b of form.querySelectorAll("button")) b.disabled = Boolean(d && d.pending);
        showFields(card, e);
        showStale(card, e);
      }
      card.querySelector(".answer").replaceChildren(...answerView(d));
      // in order, moving a card only when it is out of place (a move drops an input's focus: restoreFocus puts it back)
      const want = previous ? previous.nextSibling : box.firstChild;
      if (want !== card) box.insertBefore(card, want);
      previous = card;
    }
    if (shown.length === 0) box.replaceChildren(h("p", { class: "empty" }, list.length ? "No escalation matches the filters." : "No escalations."));
    restoreFocus(focused);
  }

  async function decide(escalationId, decision, { base: baseInput, message: messageInput, delta: deltaField, stale }) {
    const body = { decision };
    const message = messageInput.value.trim();
    if (message) body.message = message;
    if (decision === "apply") {
      // a change written against another record than the one shown now is not sent until the operator says so
      const e = itemOf(escalationId);
      const st = e && view.drafts.stale(e);
      if (st) {
        deltaField.box.open = true;
        showDeltaProblem(deltaField, `The record changed since you edited this change (written against ${st.was || "a record not read"}, it is now ${st.now || "not read"}): keep it or start again from the record now, above, before Apply.`);
        stale.keep.focus();
        return;
      }
      // the version shown is escaped (and cut when long), or may begin or end with a space: the record's own goes;
      // what is typed goes trimmed
      const base = baseToSend(e, baseInput.value);
      if (!base) {
        view.decisions.set(escalationId, { error: "Give the record version to apply on." });
        renderEscalations();
        return;
      }
      body.baseVersion = base;
      if (deltaField.use.checked) {
        // checked here as the server checks it: a change that is not a JSON Patch is not sent
        const parsed = parseDelta(deltaField.text.value);
        if (parsed.error) {
          deltaField.box.open = true;
          showDeltaProblem(deltaField, parsed.error);
          deltaField.text.focus();
          return;
        }
        body.delta = parsed.delta;
      }
    }
    showDeltaProblem(deltaField, "");
    view.decisions.set(escalationId, { pending: true, decision });
    renderEscalations();
    let result;
    try {
      const res = await fetch(`/api/escalations/${encodeURIComponent(escalationId)}/resolve`, {
        method: "POST",
        headers: { "content-type": "application/json", authorization: `Bearer ${token}` },
        body: JSON.stringify(body),
      });
      const json = await res.json().catch(() => ({}));
      result = res.ok ? { answer: json.answer, decision } : { error: `${res.status}: ${json.error ?? res.statusText}`, decision };
      if (res.ok && json.escalation && view.snap) {
        // the owner's answer, shown at once (the stream brings the same a moment later)
        view.snap.escalations = view.snap.escalations.map((e) => (e.escalationId === escalationId ? json.escalation : e));
      }
    } catch (err) {
      result = { error: `could not reach the console: ${err && err.message ? err.message : err}`, decision };
    }
    view.decisions.set(escalationId, result);
    renderEscalations();
    const refused = result.answer && result.answer.status === "rejected" ? result.answer.reason : null;
    if (refused === "resolution_delta_required") pointAtDelta(deltaField);
    else if (body.delta && OUT_OF_SCOPE.has(refused)) {
      // the owner checks the change against the tool's allowedPaths, which the page does not know: its refusal, at the change
      deltaField.box.open = true;
      showDeltaProblem(deltaField, `The record's owner refused this change: ${result.answer.message}.`);
      deltaField.text.focus();
    }
  }

  /** The owner's refusals of a change outside its tool's declared scope (the tool's allowedPaths and their operations). */
  const OUT_OF_SCOPE = new Set(["patch_path_not_allowed", "patch_op_not_allowed"]);

  // ---- rendering ----
  const renderers = {
    trust: renderTrust,
    topics: renderTopics,
    counts: renderCounts,
    inFlight: renderInFlight,
    replies: renderReplies,
    conflicts: renderConflicts,
    escalations: renderEscalations,
    deadLetters: renderDeadLetters,
    lag: () => {
      renderLag();
      renderCounts();
    },
  };
  function renderAll() {
    for (const r of Object.values(renderers)) r();
  }
  function renderFiltered() {
    if (!view.snap) return;
    renderInFlight();
    renderReplies();
    renderConflicts();
    renderEscalations();
    renderDeadLetters();
    $("f-note").textContent = filtering() ? "filtered" : "";
  }
  setInterval(() => {
    for (const e of document.querySelectorAll("[data-at]")) e.textContent = `${age(e.dataset.at)} ago`;
  }, 1000);

  function setConn(state, text) {
    const c = $("conn");
    c.dataset.state = state;
    c.textContent = text;
  }
  function showNotice(text) {
    const n = $("notice");
    n.textContent = text;
    n.hidden = !text;
  }

  function renderRole() {
    const s = view.session;
    const r = $("role");
    r.dataset.role = s ? s.role : "";
    r.textContent = s ? (s.role === "operator" ? `operator: ${s.operator}` : "read-only") : "…";
    // cards were built for another role: build them again
    for (const card of view.cards.values()) card.remove();
    view.cards.clear();
    if (view.snap) {
      renderEscalations();
      renderDeadLetters();
    }
  }

  /**
   * The escalations after an update: `order` lists every one kept (by where its record was read), `added` brings
   * new ones whole, `changed` the status fields of ones listed before.
   */
  function mergeEscalations(list, { order, added, changed }) {
    const place = (e) => `${e.where.partition}:${e.where.offset}`;
    const byPlace = new Map(list.map((e) => [place(e), e]));
    for (const e of added) byPlace.set(place(e), e);
    for (const c of changed) {
      const e = byPlace.get(place(c));
      if (e) byPlace.set(place(c), { ...e, ...c });
    }
    return order.map((p) => byPlace.get(p)).filter(Boolean);
  }

  /**
   * A recent list after an update: the items read since (newest first) in front of the ones the page has (a
   * snapshot may have had some of them already: kept once), `limit` at most.
   */
  function mergeRecent(list, added, limit) {
    const key = (x) => `${x.where.topic}\u0000${x.where.partition}:${x.where.offset}`;
    const seen = new Set();
    const out = [];
    for (const x of [...added, ...list]) {
      if (seen.has(key(x))) continue;
      seen.add(key(x));
      out.push(x);
    }
    return out.slice(0, limit);
  }

  // ---- the event stream ----
  let source = null;
  /** A one-use ticket for the event stream, asked for with the token; null (and said why) when there is none. */
  async function streamTicket() {
    let res;
    try {
      res = await fetch("/api/stream-ticket", { method: "POST", headers: { authorization: `Bearer ${token}` } });
    } catch {
      return { retry: true };
    }
    if (res.status === 401) {
      sessionStorage.removeItem(KEY);
      token = null;
      setConn("closed", "refused");
      showNotice("The console refused this token: open it with the link you were given (…/#token=…).");
      return { retry: false };
    }
    if (!res.ok) return { retry: true };
    const body = await res.json().catch(() => null);
    return body && typeof body.ticket === "string" ? { ticket: body.ticket } : { retry: true };
  }

  async function connect() {
    if (!token) {
      setConn("closed", "no token");
      showNotice("This console needs its token: open it with the link you were given (…/#token=…).");
      return;
    }
    const got = await streamTicket();
    if (!got.ticket) {
      if (got.retry) {
        setConn("closed", "disconnected");
        setTimeout(connect, 3000);
      }
      return;
    }
    source = new EventSource(`/events?ticket=${encodeURIComponent(got.ticket)}`);
    source.addEventListener("open", () => {
      setConn("live", "live");
      showNotice(fromQuery ? "This console was opened with its token in the address's query (?token=…), which servers and proxies log: use …/#token=… links." : "");
    });
    source.addEventListener("hello", (ev) => {
      const before = view.session && view.session.role;
      view.session = JSON.parse(ev.data);
      if (before !== view.session.role) renderRole();
    });
    source.addEventListener("snapshot", (ev) => {
      view.snap = JSON.parse(ev.data);
      renderAll();
    });
    source.addEventListener("update", (ev) => {
      if (!view.snap) return;
      const u = JSON.parse(ev.data);
      // what changed of the escalations and the recent lists, not the whole lists (the server's ConsoleChanges)
      if (u.escalationChanges) {
        u.escalations = mergeEscalations(view.snap.escalations, u.escalationChanges);
        delete u.escalationChanges;
      }
      const recent = (view.session && view.session.limits && view.session.limits.recent) || 100;
      if (u.replyChanges) {
        u.replies = mergeRecent(view.snap.replies, u.replyChanges.added, recent);
        delete u.replyChanges;
      }
      if (u.conflictChanges) {
        u.conflicts = mergeRecent(view.snap.conflicts, u.conflictChanges.added, recent);
        delete u.conflictChanges;
      }
      if (u.deadLetterChanges) {
        const marked = new Map(u.deadLetterChanges.sentBack.map((d) => [letterKey(d.where), d.sentBack]));
        u.deadLetters = mergeRecent(view.snap.deadLetters, u.deadLetterChanges.added, recent).map((d) => (marked.has(letterKey(d.where)) ? { ...d, sentBack: marked.get(letterKey(d.where)) } : d));
        delete u.deadLetterChanges;
      }
      Object.assign(view.snap, u);
      for (const k of Object.keys(u)) if (renderers[k]) renderers[k]();
    });
    source.addEventListener("error", () => {
      // A ticket works once: the browser's own reconnect would be refused, so each reconnect asks for a new one
      // (and a refused token is found out there). Reconnecting starts again from a snapshot.
      source.close();
      source = null;
      setConn("reconnecting", "reconnecting…");
      setTimeout(connect, 2000);
    });
  }
  void connect();
})();
