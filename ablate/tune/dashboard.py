"""optuna-dashboard served on a study's storage (ablate.tune.storage.resolve_storage says which).

May import: config, tune.storage, tune.rdb.
"""

from __future__ import annotations

import sys
from typing import Callable

from ablate.config import extras
from ablate.tune.rdb import shown_url
from ablate.tune.storage import open_storage


def serve_dashboard(
    url: str, host: str = "127.0.0.1", port: int = 8080, out: Callable[[str], None] = print
) -> int:
    """Serve until Ctrl-C; prints the address to open (port 0: any free port, the one taken is printed)."""
    from wsgiref.simple_server import WSGIRequestHandler, make_server

    optuna_dashboard = extras.load("optuna_dashboard", "ablate dashboard")

    class Quiet(WSGIRequestHandler):
        def log_message(self, *args):
            pass

    storage = open_storage(url)
    app = optuna_dashboard.wsgi(storage)
    server = make_server(host, port, app, handler_class=Quiet)
    shown = f"[{host}]" if ":" in host else host
    out(f"optuna-dashboard on {shown_url(url)}")
    out(f"open http://{shown}:{server.server_port}/dashboard/  (Ctrl-C to stop)")
    sys.stdout.flush()
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0
