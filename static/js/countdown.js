// Keeps "in 3 d 4 h" countdowns fresh without a reload. The server renders the same text,
// so the page is complete without JavaScript; this only updates it once a minute.
(function () {
  "use strict";
  function span(ms) {
    var s = Math.floor(Math.abs(ms) / 1000);
    var d = Math.floor(s / 86400), h = Math.floor((s % 86400) / 3600), m = Math.floor((s % 3600) / 60);
    if (d) return d + " d " + h + " h";
    if (h) return h + " h " + m + " min";
    return m + " min";
  }
  function refresh() {
    var nodes = document.querySelectorAll("[data-deadline]");
    for (var i = 0; i < nodes.length; i++) {
      var el = nodes[i], at = Date.parse(el.getAttribute("data-deadline"));
      if (isNaN(at)) continue;
      var ms = at - Date.now(), text = ms >= 0 ? "in " + span(ms) : span(ms) + " ago";
      var wrapped = el.textContent.trim().charAt(0) === "(";
      // Only English is rewritten; translated pages keep the server's text.
      if (document.documentElement.lang.indexOf("en") !== 0) return;
      el.textContent = wrapped ? "(" + text + ")" : text;
    }
  }
  document.addEventListener("DOMContentLoaded", function () { refresh(); setInterval(refresh, 60000); });
})();
