// Copy buttons: <button data-copy="text" hidden>. Shown only when the clipboard API is
// there (no inline JS: CSP); without it the value is still selectable on the page.
(function () {
  "use strict";
  document.addEventListener("DOMContentLoaded", function () {
    if (!navigator.clipboard) return;
    var buttons = document.querySelectorAll("button[data-copy]");
    for (var i = 0; i < buttons.length; i++) {
      var b = buttons[i];
      b.hidden = false;
      b.addEventListener("click", function (ev) {
        var btn = ev.currentTarget, label = btn.textContent;
        navigator.clipboard.writeText(btn.getAttribute("data-copy")).then(function () {
          btn.textContent = "\u2713";
          setTimeout(function () { btn.textContent = label; }, 1500);
        });
      });
    }
  });
})();
