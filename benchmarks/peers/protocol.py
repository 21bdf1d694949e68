"""The line protocol between run.py and a peer process (standard library only: it runs in every
peer's environment). One JSON command per stdin line, one JSON answer per stdout line:
``{"cmd": "equiv", "k", "lr"[, "variant"]}`` -> ``{"losses"}``, ``{"cmd": "time", "variant", "n"}``
-> ``{"times"}``, ``{"cmd": "quit"}``; an exception becomes ``{"error"}`` (the driver puts it on the page)."""

from __future__ import annotations

import json
import sys


def serve(peer, equiv_variant: bool = True, equiv=None, handlers=None) -> None:
    """Answer commands for ``peer`` (an object with ``equiv(k, lr[, variant])`` and ``time(variant, n)``) until quit or EOF.
    ``equiv``: a function of the whole command giving the losses, for peers whose check takes other arguments.
    ``handlers``: {command name: function of the whole command giving the whole answer (a dict)}, tried first."""
    for line in sys.stdin:
        cmd = json.loads(line)
        try:
            if cmd["cmd"] == "quit":
                break
            if handlers and cmd["cmd"] in handlers:
                ans = handlers[cmd["cmd"]](cmd)
            elif cmd["cmd"] == "equiv" and equiv is not None:
                ans = {"losses": equiv(cmd)}
            elif cmd["cmd"] == "equiv":
                extra = (cmd.get("variant", "dp-hooks"),) if equiv_variant else ()
                ans = {"losses": peer.equiv(cmd["k"], cmd["lr"], *extra)}
            elif cmd["cmd"] == "time":
                ans = {"times": peer.time(cmd["variant"], cmd["n"])}
            else:
                ans = {"error": f"unknown command {cmd['cmd']}"}
        except Exception as e:  # reported to the driver, which writes it on the page
            import traceback

            traceback.print_exc()  # to the peer's stderr, which the driver quotes
            ans = {"error": f"{type(e).__name__}: {str(e)[:400]}"}
        print(json.dumps(ans), flush=True)
