// Filters start collapsed on phones (the results come first); without JavaScript they
// stay open everywhere, which still works.
(function () {
  "use strict";
  var box = document.querySelector("details.filter-box");
  if (box && window.matchMedia("(max-width: 720px)").matches) box.open = false;
})();
