// MathJax 3 for the LaTeX that pymdownx.arithmatex marks (generic mode: \( \) inline, \[ \] display).
// MathJax itself is served from the site (javascripts/mathjax/, copied by scripts/docs_mathjax.py).
window.MathJax = {
  tex: {
    inlineMath: [["\\(", "\\)"]],
    displayMath: [["\\[", "\\]"]],
    processEscapes: true,
    processEnvironments: true,
  },
  options: {
    ignoreHtmlClass: ".*|",
    processHtmlClass: "arithmatex",
  },
};

// Pages loaded by instant navigation are typeset again; the first page is typeset by MathJax's startup.
document$.subscribe(() => {
  if (window.MathJax && MathJax.typesetPromise) {
    MathJax.startup.output.clearCache();
    MathJax.typesetClear();
    MathJax.texReset();
    MathJax.typesetPromise();
  }
});
