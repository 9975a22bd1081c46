// Render the math that pymdownx.arithmatex (generic mode) leaves in the page,
// <span class="arithmatex">\(...\)</span> and <div class="arithmatex">\[...\]</div>,
// with the copy of KaTeX in docs/vendor/katex (no network needed). Headings with math
// also appear as plain "\(...\)" text in the table of contents; that is rendered too.
(function () {
  var INLINE = /(\\\([\s\S]+?\\\))/;

  function renderArithmatex(root) {
    root.querySelectorAll(".arithmatex").forEach(function (el) {
      if (el.dataset.katexDone) return;
      var tex = el.textContent.trim();
      var display = el.tagName === "DIV";
      var m = tex.match(/^\\\[([\s\S]*)\\\]$/) || tex.match(/^\$\$([\s\S]*)\$\$$/);
      if (m) {
        display = true;
      } else {
        m = tex.match(/^\\\(([\s\S]*)\\\)$/) || tex.match(/^\$([\s\S]*)\$$/);
      }
      if (m) tex = m[1];
      katex.render(tex, el, {displayMode: display, throwOnError: false});
      el.dataset.katexDone = "1";
    });
  }

  function renderNavText(root) {
    root.querySelectorAll(".md-nav").forEach(function (nav) {
      var walker = document.createTreeWalker(nav, NodeFilter.SHOW_TEXT);
      var nodes = [];
      while (walker.nextNode()) {
        if (INLINE.test(walker.currentNode.nodeValue)) nodes.push(walker.currentNode);
      }
      nodes.forEach(function (node) {
        var frag = document.createDocumentFragment();
        node.nodeValue.split(INLINE).forEach(function (part) {
          var m = part.match(/^\\\(([\s\S]+)\\\)$/);
          if (m) {
            var span = document.createElement("span");
            katex.render(m[1], span, {throwOnError: false});
            frag.appendChild(span);
          } else if (part) {
            frag.appendChild(document.createTextNode(part));
          }
        });
        node.parentNode.replaceChild(frag, node);
      });
    });
  }

  function render() {
    renderArithmatex(document);
    renderNavText(document);
  }

  if (typeof document$ !== "undefined") {
    document$.subscribe(render);
  } else {
    document.addEventListener("DOMContentLoaded", render);
  }
})();
