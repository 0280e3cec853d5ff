// The console's own script (no library but htmx): times in the viewer's time zone, and live parts
// that keep what the viewer opened or scrolled when htmx swaps them.
(function () {
  "use strict";
  var format = new Intl.DateTimeFormat(undefined, {
    year: "numeric", month: "2-digit", day: "2-digit",
    hour: "2-digit", minute: "2-digit", second: "2-digit", timeZoneName: "short"
  });

  function localTimes(root) {
    root.querySelectorAll("time[datetime]").forEach(function (el) {
      var when = new Date(el.getAttribute("datetime"));
      if (!isNaN(when)) { el.textContent = format.format(when); el.title = el.getAttribute("datetime"); }
    });
  }

  function followLogs(root) {
    root.querySelectorAll("pre.log").forEach(function (el) { el.scrollTop = el.scrollHeight; });
  }

  var openDetails = null;
  document.addEventListener("htmx:beforeSwap", function (evt) {
    openDetails = {};
    evt.detail.target.querySelectorAll("details[id]").forEach(function (d) { openDetails[d.id] = d.open; });
  });
  document.addEventListener("htmx:afterSwap", function (evt) {
    var target = evt.detail.target;
    if (openDetails) {
      target.querySelectorAll("details[id]").forEach(function (d) {
        if (Object.prototype.hasOwnProperty.call(openDetails, d.id)) { d.open = openDetails[d.id]; }
      });
      openDetails = null;
    }
    localTimes(target);
    followLogs(target);
  });
  document.addEventListener("DOMContentLoaded", function () {
    localTimes(document);
    followLogs(document);
  });
})();
