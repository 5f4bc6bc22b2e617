// The 401 page: a reload of the console (its address no longer carries the
// token) opens it again with the token this tab kept; a token in the address
// that was refused is forgotten.
"use strict";
(() => {
  const KEY = "writ-console-token";
  const note = document.getElementById("locked-note");
  const params = new URLSearchParams(location.search);
  if (params.has("token")) {
    sessionStorage.removeItem(KEY);
    if (note) note.textContent = "The token in the address was refused.";
    return;
  }
  const kept = sessionStorage.getItem(KEY);
  if (kept) location.replace(`/?token=${encodeURIComponent(kept)}`);
})();
