/* Sizing calculator: let htmx swap 400 responses into the results panel, so the
   engine's error message (naming the field) replaces a stale answer. */
document.addEventListener("htmx:beforeSwap", function (event) {
  var detail = event.detail;
  if (detail.xhr && detail.xhr.status === 400 && detail.target && detail.target.id === "sizing-results") {
    detail.shouldSwap = true;
    detail.isError = false;
  }
});
