// A code span of a table cell with no space in it (a name, an option such as
// --quick) is one word: it never breaks, not even at a hyphen (docs/css/site.css).
document$.subscribe(() => {
  for (const code of document.querySelectorAll(".md-typeset table:not([class]) code")) {
    if (!/\s/.test(code.textContent)) code.style.whiteSpace = "nowrap";
  }
});
