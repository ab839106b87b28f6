"""Commands that run services: ``serve`` (the backend) and ``worker`` (a worker agent).

Web and torch packages are imported only when one of them runs, so the rest of the
command line starts fast and works without them.
"""

import argparse
import os
import socket
import sys
from typing import Any

_Formatter = argparse.RawDescriptionHelpFormatter

_SERVE_HELP = """\
Run the backend: the REST API under /api/, OpenAPI at /openapi.json, websockets at
/ws/worker and /ws/runs/{id}. Settings come from PIPESTUDIO_* environment variables
(docs/backend.md); the options below override them. Without PIPESTUDIO_API_TOKEN a
random API token is made and printed; workers use PIPESTUDIO_WORKER_TOKEN, or the API
token when that is unset.

example:
  pipestudio serve --port 8000 --database-url postgresql://postgres@127.0.0.1/pipestudio
"""

_WORKER_HELP = """\
Run a worker agent: it registers this machine's devices with the backend, starts engine
processes for the ranks it is assigned, and streams their metrics and events back. It
reconnects by itself when the backend goes away, losing nothing it measured meanwhile.

example:
  pipestudio worker --server http://127.0.0.1:8000 --token TOKEN --slots 2 --device cpu
"""


def add_commands(commands: Any) -> None:
    parser = commands.add_parser("serve", formatter_class=_Formatter, description=_SERVE_HELP,
                                 help="run the backend (REST API and websockets)")
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8000,
                        help="port to listen on; 0 picks a free one (default 8000)")
    parser.add_argument("--database-url", metavar="URL",
                        help="sqlite:///FILE or postgresql://USER@HOST/DB "
                             "(default: PIPESTUDIO_DATABASE_URL, else .pipestudio/pipestudio.db)")
    parser.set_defaults(handler=_serve)

    parser = commands.add_parser("worker", formatter_class=_Formatter,
                                 description=_WORKER_HELP,
                                 help="run a worker agent that trains what the backend assigns")
    parser.add_argument("--server", required=True, metavar="URL",
                        help="the backend, e.g. http://127.0.0.1:8000")
    parser.add_argument("--token", metavar="TOKEN",
                        help="worker token (default: PIPESTUDIO_WORKER_TOKEN)")
    parser.add_argument("--name", help="name shown in the dashboard (default: host-pid)")
    parser.add_argument("--slots", type=int, metavar="N",
                        help="ranks this worker runs at once (default: one per device)")
    parser.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"),
                        help="devices to advertise; auto: CUDA when available (default)")
    parser.add_argument("--advertise-host", metavar="ADDRESS",
                        help="address peers dial for the run's store (default: this "
                             "machine's address on the route to the server)")
    parser.set_defaults(handler=_worker)


def _serve(args: argparse.Namespace) -> int:
    import uvicorn

    from pipestudio.backend.app import create_app
    from pipestudio.backend.db import DatabaseUrlError
    from pipestudio.backend.settings import Settings

    overrides = {"database_url": args.database_url} if args.database_url else {}
    settings = Settings(**overrides)
    try:
        app = create_app(settings)
    except DatabaseUrlError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    settings = app.state.settings
    listener = socket.socket(socket.AF_INET6 if ":" in args.host else socket.AF_INET)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listener.bind((args.host, args.port))
    except OSError as exc:
        print(f"error: cannot listen on {args.host}:{args.port}: {exc.strerror}",
              file=sys.stderr)
        return 2
    port = listener.getsockname()[1]
    print(f"PipeStudio backend on http://{args.host}:{port} (database "
          f"{app.state.context.db.dialect})", flush=True)
    if "PIPESTUDIO_API_TOKEN" not in os.environ:
        print(f"API token: {settings.api_token}", flush=True)
    config = uvicorn.Config(app, log_level="warning", ws_max_size=2**26,
                            ws_per_message_deflate=False)
    uvicorn.Server(config).run(sockets=[listener])
    return 0


def _worker(args: argparse.Namespace) -> int:
    import asyncio
    import logging

    from pipestudio.runtime.agent.agent import Agent
    from pipestudio.runtime.agent.connection import AgentAuthError

    token = args.token or os.environ.get("PIPESTUDIO_WORKER_TOKEN")
    if not token:
        print("error: give --token or set PIPESTUDIO_WORKER_TOKEN", file=sys.stderr)
        return 2
    if args.slots is not None and args.slots < 0:
        print(f"error: --slots must be >= 0, got {args.slots}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    agent = Agent(args.server, token, name=args.name, slots=args.slots, device=args.device,
                  advertise_host=args.advertise_host)
    print(f"worker {agent.name}: {len(agent.devices)} device(s), {agent.slots} slot(s), "
          f"serving {args.server}", flush=True)
    try:
        asyncio.run(agent.run())
    except AgentAuthError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 0
    return 0
