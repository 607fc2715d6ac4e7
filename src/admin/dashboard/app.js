// talboot's dashboard: draws /api/dashboard and follows /api/events (server-sent events).
// Served from the binary; it talks to its own origin only. What a node's progress or a
// failure is, the server decides (src/http/dashboard.rs); this script only draws it.
"use strict";

let snap = null;
let selected = null;
let pending = null;
let eventsSeen = 0;

const $ = (id) => document.getElementById(id);

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") e.className = v;
    else if (k === "text") e.textContent = v;
    else e.setAttribute(k, v);
  }
  for (const c of children) if (c) e.append(c);
  return e;
}

function when(ms) {
  return new Date(ms).toISOString().replace("T", " ").slice(0, 23);
}

async function load() {
  pending = null;
  try {
    const r = await fetch("/api/dashboard", { cache: "no-store" });
    if (!r.ok) throw new Error(`${r.status} ${await r.text()}`);
    snap = await r.json();
    render();
  } catch (e) {
    notice(`cannot read the dashboard: ${e.message}`, true);
  }
}

// Many events arrive in bursts (a rack booting): re-read the snapshot once per burst.
function soon() {
  if (!pending) pending = setTimeout(load, 150);
}

function notice(text, bad) {
  const n = $("notice");
  n.textContent = text;
  n.className = bad ? "failure" : "";
}

function timelineRows(tbody, events) {
  tbody.replaceChildren(
    ...events.map((ev) =>
      el(
        "tr",
        { class: ev.failure ? "fail" : "" },
        el("td", { class: "t", text: when(ev.at_unix_ms) }),
        el("td", { class: "k", text: ev.kind }),
        el("td", { text: ev.detail }),
      ),
    ),
  );
}

function nodeCard(n) {
  const reached = n.progress.filter((m) => m.reached);
  const last = reached.length ? reached[reached.length - 1].name : null;
  const bar = el("div", { class: "progress" });
  let stuckShown = false;
  for (const m of n.progress) {
    let cls = m.reached ? "reached" : "";
    if (!m.reached && n.phase === "failed" && !stuckShown) {
      cls = "stuck";
      stuckShown = true;
    }
    const title = m.name + (m.at_unix_ms ? ` at ${when(m.at_unix_ms)}` : m.reached ? "" : " (not yet)");
    bar.append(el("span", { class: cls, title, "data-milestone": m.name }));
  }
  const actions = el("div", { class: "actions" });
  const action = (label, path, question) => {
    const b = el("button", { text: label, "data-action": path.split("/").slice(-1)[0] });
    b.addEventListener("click", (e) => {
      e.stopPropagation();
      act(`/api/nodes/${encodeURIComponent(n.name)}/${path}`, question);
    });
    actions.append(b);
  };
  action("Rebuild", "rebuild", `Rebuild ${n.name}? talboot resets it (its disk is wiped) and provisions it again on its next network boot.`);
  if (n.power) {
    action("Power on", "power/on", `Power on ${n.name}?`);
    action("Power off", "power/off", `Power off ${n.name}? It stops at once, without a shutdown.`);
    action("Power cycle", "power/cycle", `Power-cycle ${n.name}? It restarts at once, without a shutdown.`);
  }
  const card = el(
    "div",
    { class: "node" + (selected === n.name ? " selected" : ""), id: `node-${n.name}`, "data-phase": n.phase },
    el(
      "div",
      { class: "top" },
      el("span", { class: "name", text: n.name }),
      el("span", { class: "addr", text: n.address }),
      el("span", { class: `phase ${n.phase}`, text: n.phase }),
    ),
    bar,
    el("div", { class: "progress-label", text: last ? `got to: ${last} (${reached.length}/${n.progress.length})` : "not seen yet" }),
    n.failure ? el("p", { class: "failure", text: n.failure }) : null,
    actions,
  );
  card.addEventListener("click", () => {
    selected = selected === n.name ? null : n.name;
    render();
  });
  return card;
}

function render() {
  if (!snap) return;
  const c = snap.cluster;
  $("cluster-name").textContent = c.name;
  $("versions").textContent = `Talos ${c.talos_version}, Kubernetes ${c.kubernetes_version}`;
  $("steps").replaceChildren(
    ...c.steps.map((s) =>
      el("li", {
        class: s.state,
        "data-step": s.name,
        title: s.error ? `${s.error} (${s.attempts} failed attempts)` : s.reason || s.state,
        text: s.name + (s.attempts ? ` (${s.attempts} failed)` : ""),
      }),
    ),
  );
  $("rack").replaceChildren(
    ...snap.roles.map((r) =>
      el(
        "div",
        { class: "role", "data-role": r.name },
        el("h2", { text: `${r.name} ` }, el("small", { text: `${r.machine_type}, ${r.nodes.length} node(s)` })),
        el("div", { class: "nodes" }, ...r.nodes.map(nodeCard)),
      ),
    ),
  );
  const node = selected && snap.roles.flatMap((r) => r.nodes).find((n) => n.name === selected);
  $("detail").hidden = !node;
  if (node) {
    $("detail-name").textContent = node.name;
    $("detail-failure").hidden = !node.failure;
    $("detail-failure").textContent = node.failure ? `failed: ${node.failure}` : "";
    timelineRows($("timeline"), node.timeline);
  }
  timelineRows($("cluster-timeline"), c.timeline);
  document.body.dataset.renders = String(Number(document.body.dataset.renders || 0) + 1);
}

function confirmed(question) {
  const d = $("confirm");
  $("confirm-text").textContent = question;
  d.returnValue = "";
  return new Promise((resolve) => {
    d.addEventListener("close", () => resolve(d.returnValue === "ok"), { once: true });
    d.showModal();
  });
}

async function act(url, question) {
  if (!(await confirmed(question))) {
    notice("cancelled");
    return;
  }
  try {
    const r = await fetch(url, { method: "POST" });
    notice((await r.text()).trim(), !r.ok);
  } catch (e) {
    notice(`request failed: ${e.message}`, true);
  }
  soon();
}

function follow() {
  const live = $("live");
  const es = new EventSource("/api/events");
  es.addEventListener("open", () => {
    live.textContent = "live";
    live.className = "live on";
    // Anything missed while disconnected is in the snapshot.
    soon();
  });
  es.addEventListener("error", () => {
    live.textContent = "reconnecting";
    live.className = "live off";
  });
  es.addEventListener("node", (m) => {
    eventsSeen += 1;
    document.body.dataset.events = String(eventsSeen);
    const ev = JSON.parse(m.data);
    if (snap) {
      const n = snap.roles.flatMap((r) => r.nodes).find((x) => x.name === ev.node);
      const tl = n ? n.timeline : ev.node === "cluster" ? snap.cluster.timeline : null;
      if (tl) {
        tl.push(ev);
        render();
      }
    }
    soon();
  });
  es.addEventListener("resync", soon);
}

// The fleet on a shared etcd (/api/ha: the appliances, the leader, etcd's health); the
// section stays hidden on redb. Re-read as often as the appliance probes etcd.
async function loadHa() {
  try {
    const r = await fetch("/api/ha", { cache: "no-store" });
    if (r.ok) renderHa(await r.json());
  } catch (e) {
    // The snapshot's notice already says when the appliance cannot be reached.
  }
}

function renderHa(ha) {
  $("ha-section").hidden = ha.store !== "etcd";
  if (ha.store !== "etcd") return;
  const etcd = ha.etcd;
  $("ha-etcd").textContent = etcd ? etcd.summary : "etcd not probed yet";
  $("ha-etcd").className = etcd && etcd.verdict !== "healthy" ? "failure" : "";
  $("ha-leader").textContent = ha.leader
    ? `leader: ${ha.leader} (${ha.leader_admin_url})`
    : "no appliance leads the fleet right now";
  const cell = (text) => el("td", { text });
  $("ha-appliances").replaceChildren(
    ...ha.appliances.map((a) =>
      el(
        "tr",
        { "data-appliance": a.name, class: a.leader ? "leader" : "" },
        cell(a.name),
        cell(a.leader ? "leader" : ""),
        cell(a.version),
        cell(when(a.started_unix_ms)),
        cell(a.admin_url),
        cell(a.http_url),
      ),
    ),
  );
  $("ha-endpoints").replaceChildren(
    ...(etcd ? etcd.endpoints : []).map((p) =>
      el(
        "tr",
        { class: p.up ? "" : "fail" },
        cell(p.url),
        cell(p.up ? "yes" : "no"),
        cell(p.leader ? "leader" : ""),
        cell(p.db_size == null ? "-" : `${p.db_size} B`),
        cell(p.errors.join("; ") || "-"),
      ),
    ),
  );
  $("ha-problems").textContent = ha.problems.join("; ");
}

load();
follow();
loadHa();
setInterval(loadHa, 5000);
