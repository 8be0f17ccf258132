// The dashboard's only script besides htmx: copy buttons, error notices, tabs, relative times. Loaded from
// static/ like htmx itself (the CSP allows no inline script).
(function () {
  "use strict";

  function showToast(text) {
    var toast = document.getElementById("toast");
    if (!toast) return;
    toast.textContent = text;
    toast.hidden = false;
    clearTimeout(showToast.timer);
    showToast.timer = setTimeout(function () { toast.hidden = true; }, 8000);
  }

  // A command copied with a signature that receivers refuse by now (data-expires-at, on a page
  // drawn before then): said at once, where it was copied, not by the receiver's 400 later.
  function warnIfStale(button) {
    var expires = Date.parse(button.getAttribute("data-expires-at") || "");
    if (isNaN(expires) || Date.now() < expires) return;
    var note = document.getElementById(button.getAttribute("data-expired-note") || "");
    if (note) note.classList.add("attempt-replay-expired");
    showToast("Copied, but its timestamp is too old now: a receiver that checks timestamps " +
      "refuses it (it expired " + relativeTime(expires, Date.now()) + ").");
  }

  // The event catalogue folds each sample body: the one a link points at (#deal.completed) opens.
  function openTargetedSample() {
    var id = decodeURIComponent(location.hash.slice(1));
    var entry = id && document.getElementById(id);
    var fold = entry && entry.querySelector("details.event-sample-fold");
    if (fold) fold.open = true;
  }
  window.addEventListener("hashchange", openTargetedSample);
  document.addEventListener("DOMContentLoaded", openTargetedSample);

  // Copy buttons: data-copy holds the text, or data-copy-from names the element whose text it
  // is (a long command shown on the page anyway). The label confirms, then returns.
  document.addEventListener("click", function (event) {
    var button = event.target.closest("[data-copy], [data-copy-from]");
    if (!button) return;
    var source = button.getAttribute("data-copy-from");
    var text = source ? document.getElementById(source).textContent : button.getAttribute("data-copy");
    var done = function () {
      var label = button.textContent;
      button.textContent = "Copied";
      setTimeout(function () { button.textContent = label; }, 1500);
      warnIfStale(button);
    };
    if (navigator.clipboard && window.isSecureContext) {
      navigator.clipboard.writeText(text).then(done, function () { showToast("Copy failed: select the text and copy it."); });
    } else {
      var area = document.createElement("textarea");
      area.value = text;
      area.setAttribute("readonly", "");
      area.className = "visually-hidden";
      document.body.appendChild(area);
      area.select();
      try { document.execCommand("copy"); done(); } catch (e) { showToast("Copy failed: select the text and copy it."); }
      document.body.removeChild(area);
    }
  });

  // htmx swaps no 4xx/5xx answer: show the server's message instead of doing nothing.
  document.addEventListener("htmx:responseError", function (event) {
    var xhr = event.detail.xhr;
    var text = "";
    try {
      var doc = new DOMParser().parseFromString(xhr.responseText, "text/html");
      text = (doc.body && doc.body.textContent || "").trim();
    } catch (e) { /* fall through */ }
    showToast(text || ("The request failed (HTTP " + xhr.status + ")."));
  });
  document.addEventListener("htmx:sendError", function () {
    showToast("The dashboard cannot reach the server; check your connection and retry.");
  });

  // Tabs (verification snippets): buttons with aria-controls show one panel of their group.
  // The page renders every panel and a hidden tab row, so it reads fine without this script.
  function selectTab(tab) {
    tab.closest("[role=tablist]").querySelectorAll("[role=tab]").forEach(function (other) {
      var selected = other === tab;
      other.setAttribute("aria-selected", selected ? "true" : "false");
      var panel = document.getElementById(other.getAttribute("aria-controls"));
      if (panel) panel.hidden = !selected;
    });
  }
  document.addEventListener("htmx:load", function (event) {
    event.detail.elt.querySelectorAll("[role=tablist][hidden]").forEach(function (list) {
      list.hidden = false;
      selectTab(list.querySelector("[role=tab][aria-selected=true]") || list.querySelector("[role=tab]"));
    });
  });
  document.addEventListener("click", function (event) {
    var tab = event.target.closest("[role=tab]");
    if (tab) selectTab(tab);
  });

  // Relative times ("2 h ago", "in 4 min") beside each absolute one, kept current on a page
  // left open; the same rules as blueprints/dashboard/formatting.py, which wrote them.
  var MINUTE = 60, HOUR = 3600, DAY = 86400;
  function relativeTime(at, now) {
    var seconds = (at - now) / 1000;
    var span = Math.abs(seconds);
    if (span < MINUTE) return seconds <= 0 ? "just now" : "in under a minute";
    var amount = span < HOUR ? Math.floor(span / MINUTE) + " min"
      : span < 2 * DAY ? Math.floor(span / HOUR) + " h"
      : Math.floor(span / DAY) + " d";
    return seconds < 0 ? amount + " ago" : "in " + amount;
  }
  function refreshRelativeTimes() {
    var now = Date.now();
    document.querySelectorAll(".ago[data-at]").forEach(function (element) {
      var at = Date.parse(element.getAttribute("data-at"));
      if (!isNaN(at)) element.textContent = relativeTime(at, now);
    });
  }
  setInterval(refreshRelativeTimes, 30000);
  document.addEventListener("visibilitychange", function () {
    if (!document.hidden) refreshRelativeTimes();
  });

  // Checkbox groups (an endpoint's events): [data-check=all|none] buttons tick or clear the
  // boxes of their [data-check-group]. They, and the [data-copy-from] buttons, are rendered
  // hidden, shown here, so a page without this script offers no button that does nothing.
  document.addEventListener("htmx:load", function (event) {
    event.detail.elt.querySelectorAll("[data-check], [data-copy-from]").forEach(function (button) {
      button.hidden = false;
    });
  });
  document.addEventListener("click", function (event) {
    var button = event.target.closest("[data-check]");
    if (!button) return;
    var group = button.closest("[data-check-group]");
    if (!group) return;
    var checked = button.getAttribute("data-check") === "all";
    group.querySelectorAll("input[type=checkbox]").forEach(function (box) { box.checked = checked; });
  });
})();
