// The report's behaviour: pan, zoom and search in the graph, regions that open their kernel card
// and collapse, a sortable kernel table, and kernel sources downloaded as data URLs. Everything
// works on the page alone (its policy forbids any request).
(function () {
  "use strict";
  var svg = document.getElementById("graph-svg");
  if (!svg) { return; }  // a page without a drawing says why (docs/report.md); its tables work
  var data = JSON.parse(document.getElementById("graph-data").textContent);
  var box = document.getElementById("graph");
  var full = svg.viewBox.baseVal;
  var whole = {x: full.x, y: full.y, w: full.width, h: full.height};
  var view = {x: 0, y: 0, w: 1, h: 1};
  var regionOf = {};
  Object.keys(data.members).forEach(function (region) {
    data.members[region].forEach(function (id) { regionOf[id] = region; });
  });

  function show() { svg.setAttribute("viewBox", [view.x, view.y, view.w, view.h].join(" ")); }
  function aspect() { return box.clientHeight / Math.max(box.clientWidth, 1); }
  // Fit: the whole graph in view.
  function fit() {
    var w = Math.max(whole.w, whole.h / aspect());
    view = {x: whole.x - (w - whole.w) / 2, y: whole.y, w: w, h: w * aspect()};
    show();
  }
  // The first view: life size at the top, the model's first input in the middle, as Netron
  // opens a model; "fit" shows the whole graph.
  function start() {
    view = {x: whole.x, y: whole.y, w: box.clientWidth, h: box.clientHeight};
    var first = document.getElementById("in0");
    if (first) { centre(first); }
    view.y = whole.y;
    show();
  }
  function zoom(factor, cx, cy) {
    cx = cx === undefined ? view.x + view.w / 2 : cx;
    cy = cy === undefined ? view.y + view.h / 2 : cy;
    view = {x: cx - (cx - view.x) * factor, y: cy - (cy - view.y) * factor,
            w: view.w * factor, h: view.h * factor};
    show();
  }
  function centre(element) {
    var b = element.getBBox();
    var m = element.getCTM(), root = svg.getCTM();
    // the element's box in the svg's user space (dot's graph group carries a transform)
    var p = svg.createSVGPoint();
    p.x = b.x + b.width / 2; p.y = b.y + b.height / 2;
    var q = p.matrixTransform(root.inverse().multiply(m));
    view.x = q.x - view.w / 2; view.y = q.y - view.h / 2;
    show();
  }
  function toUser(event) {
    var p = svg.createSVGPoint();
    p.x = event.clientX; p.y = event.clientY;
    return p.matrixTransform(svg.getScreenCTM().inverse());
  }

  box.addEventListener("wheel", function (event) {
    event.preventDefault();
    var at = toUser(event);
    zoom(event.deltaY > 0 ? 1.2 : 1 / 1.2, at.x, at.y);
  }, {passive: false});
  var drag = null;
  box.addEventListener("mousedown", function (event) {
    drag = {x: event.clientX, y: event.clientY, view: Object.assign({}, view), moved: false};
    box.classList.add("dragging");
  });
  window.addEventListener("mousemove", function (event) {
    if (!drag) { return; }
    var scale = view.w / box.clientWidth;
    var dx = event.clientX - drag.x, dy = event.clientY - drag.y;
    if (Math.abs(dx) + Math.abs(dy) > 3) { drag.moved = true; }
    view.x = drag.view.x - dx * scale; view.y = drag.view.y - dy * scale;
    show();
  });
  window.addEventListener("mouseup", function () {
    box.classList.remove("dragging");
    setTimeout(function () { drag = null; }, 0);
  });
  document.getElementById("graph-fit").onclick = fit;
  document.getElementById("graph-zoom-in").onclick = function () { zoom(1 / 1.5); };
  document.getElementById("graph-zoom-out").onclick = function () { zoom(1.5); };

  // A region: a click opens its kernel card (a group of identical kernels shares one card).
  function cardOf(region) {
    return document.getElementById("kernel-" + region) ||
      document.querySelector('details.card[data-kernels~="' + region + '"]');
  }
  function openCard(region) {
    var card = cardOf(region);
    if (!card) { return; }
    document.querySelectorAll("details.card.selected").forEach(function (c) { c.classList.remove("selected"); });
    card.open = true;
    card.classList.add("selected");
    card.scrollIntoView({block: "start"});
  }
  function regionOfElement(element) {
    if (element.classList.contains("cluster") || element.classList.contains("region-box")) {
      return element.id.replace(/^region-/, "");  // a region's cluster, or its one box
    }
    return regionOf[element.id];
  }
  svg.querySelectorAll("g.cluster, g.node.fused, g.node.fell-back").forEach(function (element) {
    element.addEventListener("click", function (event) {
      if (drag && drag.moved) { return; }
      event.stopPropagation();
      openCard(regionOfElement(element));
    });
  });
  // Collapsing a region hides its ops and inner edges; its cluster stays, filled.
  function collapse(region, hidden) {
    var cluster = document.getElementById("region-" + region);
    if (cluster) { cluster.classList.toggle("collapsed", hidden); }
    data.members[region].forEach(function (id) {
      var element = document.getElementById(id);
      if (element) { element.classList.toggle("hidden", hidden); }
    });
  }
  svg.querySelectorAll("g.cluster").forEach(function (cluster) {
    cluster.addEventListener("dblclick", function (event) {
      event.stopPropagation();
      var region = regionOfElement(cluster);
      collapse(region, !cluster.classList.contains("collapsed"));
    });
  });
  document.getElementById("graph-collapse").onclick = function () {
    Object.keys(data.members).forEach(function (r) { collapse(r, true); });
  };
  document.getElementById("graph-expand").onclick = function () {
    Object.keys(data.members).forEach(function (r) { collapse(r, false); });
  };

  // Search: every op, input or output whose type or names contain the text; "next" steps on.
  var hits = [], at = -1;
  var search = document.getElementById("graph-search");
  function find() {
    var text = search.value.trim().toLowerCase();
    svg.querySelectorAll(".hit").forEach(function (e) { e.classList.remove("hit"); });
    hits = [];
    at = -1;
    if (text) {
      Object.keys(data.search).forEach(function (id) {
        if (data.search[id].toLowerCase().indexOf(text) >= 0) {
          var element = document.getElementById(id);
          if (element) { element.classList.add("hit"); hits.push(element); }
        }
      });
    }
    document.getElementById("graph-hits").textContent = text ? hits.length + " found" : "";
    step();
  }
  function step() {
    if (!hits.length) { return; }
    at = (at + 1) % hits.length;
    var region = regionOf[hits[at].id];
    if (region) { collapse(region, false); }
    centre(hits[at]);
  }
  search.addEventListener("input", find);
  search.addEventListener("keydown", function (event) { if (event.key === "Enter") { step(); } });
  document.getElementById("graph-next").onclick = step;
  start();
})();

(function () {
  "use strict";
  // The kernel table sorts by a column's number, largest first; a second click reverses.
  var table = document.getElementById("kernel-table");
  table.querySelectorAll("th[data-sort]").forEach(function (head) {
    head.addEventListener("click", function () {
      var key = head.dataset.sort, body = table.tBodies[0];
      var descending = head.dataset.order !== "desc";
      table.querySelectorAll("th[data-sort]").forEach(function (h) { delete h.dataset.order; });
      head.dataset.order = descending ? "desc" : "asc";
      var rows = Array.prototype.slice.call(body.rows);
      rows.sort(function (a, b) {
        var d = parseFloat(a.getAttribute("data-" + key)) - parseFloat(b.getAttribute("data-" + key));
        return descending ? -d : d;
      });
      rows.forEach(function (row) { body.appendChild(row); });
    });
  });

  // A card's body comes as the text of a script element and becomes elements when the card first opens: parsing
  // every card's elements up front was most of a large page's load time (docs/report.md).
  function fill(card) {
    var body = card.querySelector(":scope > script.card-body");
    if (body) {
      body.insertAdjacentHTML("afterend", body.textContent);
      body.remove();
    }
  }
  document.querySelectorAll("details.card, details.plots").forEach(function (card) {
    if (card.open) { fill(card); }
    card.addEventListener("toggle", function () { if (card.open) { fill(card); } });
  });

  // A kernel's source, from its card, as a data URL when its link is clicked (the links come
  // with their cards' bodies, so one listener serves them all).
  document.addEventListener("click", function (event) {
    var link = event.target.closest ? event.target.closest("a.source-download") : null;
    if (!link) { return; }
    var code = link.closest("details").querySelector("pre.source");
    link.href = "data:text/x-python;charset=utf-8," + encodeURIComponent(code.textContent);
    link.download = link.dataset.filename;
  });
})();
