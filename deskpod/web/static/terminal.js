// A shell session's terminal: xterm.js (installed by npm) over the session's WebSocket, speaking terminado's JSON
// messages: ["stdin", text] and ["set_size", rows, cols] out; ["setup", {}], ["stdout", text], ["disconnect", 1] in.
(function () {
  "use strict";
  var box = document.getElementById("terminal");
  if (!box || !window.Terminal) { return; }
  var status = document.getElementById("terminal-status");
  var term = new window.Terminal({ convertEol: false, cursorBlink: true, scrollback: 5000 });
  var Fit = window.FitAddon && (window.FitAddon.FitAddon || window.FitAddon);
  var fit = Fit ? new Fit() : null;
  if (fit) { term.loadAddon(fit); }
  term.open(box);
  if (fit) { fit.fit(); }
  var scheme = location.protocol === "https:" ? "wss://" : "ws://";
  var ws = new WebSocket(scheme + location.host + box.dataset.socket);
  function say(text) { if (status) { status.textContent = text; } }
  function size() {
    if (fit) { fit.fit(); }
    if (ws.readyState === WebSocket.OPEN) { ws.send(JSON.stringify(["set_size", term.rows, term.cols])); }
  }
  ws.onopen = function () { say("connected"); size(); term.focus(); };
  ws.onmessage = function (event) {
    var msg = JSON.parse(event.data);
    if (msg[0] === "stdout") { term.write(msg[1]); }
    else if (msg[0] === "disconnect") { say("the shell has ended"); }
  };
  ws.onclose = function (event) {
    say(event.code === 4404 ? "this shell is not yours, or has ended" : "disconnected (reload to reconnect)");
  };
  term.onData(function (data) {
    if (ws.readyState === WebSocket.OPEN) { ws.send(JSON.stringify(["stdin", data])); }
  });
  window.addEventListener("resize", size);
})();
