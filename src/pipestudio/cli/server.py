"""Commands that run services: ``serve`` (the backend with the dashboard), ``worker`` (a
worker agent) and ``db upgrade`` (the schema migration a deployment runs once).

Web and torch packages are imported only when one of them runs, so the rest of the
command line starts fast and works without them.
"""

import argparse
import contextlib
import faulthandler
import os
import secrets
import signal
import socket
import sys
from pathlib import Path
from typing import Any

from pipestudio.backend.users import MAX_PASSWORD_CHARS, ROLES  # standard library only
from pipestudio.gc_freeze import settle_heap

_Formatter = argparse.RawDescriptionHelpFormatter
#: Addresses that mean "every interface": the dashboard reaches its backend on loopback.
_WILDCARDS = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}

_SERVE_HELP = """\
Run the backend and the dashboard in one process: the dashboard at /, the REST API under
/api/, OpenAPI at /openapi.json, websockets at /ws/worker and /ws/runs/{id}. Settings come
from PIPESTUDIO_* environment variables (docs/backend.md); the options below override
them. Without PIPESTUDIO_API_TOKEN a random API token is made and printed; workers use
PIPESTUDIO_WORKER_TOKEN, or the API token when that is unset.

example:
  pipestudio serve --port 8000 --database-url postgresql://postgres@127.0.0.1/pipestudio
"""

_WORKER_HELP = """\
Run a worker agent: it registers this machine's devices with the backend, starts engine
processes for the ranks it is assigned, and streams their metrics and events back. It
reconnects by itself when the backend goes away, losing nothing it measured meanwhile, and
keeps its id across restarts (its id and secret are kept in --state-dir).

It runs the built-in models, and other model factories (MODULE:FACTORY, FILE.py:FACTORY)
only where --allow-model or PIPESTUDIO_ALLOWED_MODELS (comma-separated) matches them: a
model is code run on this machine, and the API token alone must not run any of it.

example:
  pipestudio worker --server http://127.0.0.1:8000 --token TOKEN --slots 2 --device cpu \\
      --allow-model 'mypkg.models:*'
"""

_DB_HELP = """\
Bring the database to the newest schema revision (Alembic upgrade head) and exit; a
database already there is left as it is. The database is PIPESTUDIO_DATABASE_URL's,
or --database-url's. `pipestudio serve` does the same on start unless
PIPESTUDIO_MIGRATE_ON_START=false (as in docker-compose.yml, whose one-shot `migrate`
service runs this command).

example:
  pipestudio db upgrade --database-url postgresql://postgres@127.0.0.1/pipestudio
"""

_HASH_HELP = """\
Print a PIPESTUDIO_USERS entry (NAME:ROLE:HASH) for a person who may sign in: the
password is read twice from the terminal (once from standard input when it is not a
terminal) and only its scrypt hash is printed. Join entries with commas.

example:
  pipestudio hash-password ada --role editor
"""

_DB_GROUP_HELP = """\
Manage the backend's database schema (PIPESTUDIO_DATABASE_URL, or --database-url).

actions:
  pipestudio db upgrade [--database-url URL]   migrate to the newest schema revision
"""


def add_commands(commands: Any) -> None:
    parser = commands.add_parser(
        "serve",
        formatter_class=_Formatter,
        description=_SERVE_HELP,
        help="run the backend and the dashboard",
    )
    parser.add_argument(
        "--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)"
    )
    parser.add_argument(
        "--port",
        type=int,
        default=8000,
        help="port to listen on; 0 picks a free one (default 8000)",
    )
    _database_url_option(parser)
    parser.set_defaults(handler=_serve)

    parser = commands.add_parser(
        "worker",
        formatter_class=_Formatter,
        description=_WORKER_HELP,
        help="run a worker agent that trains what the backend assigns",
    )
    parser.add_argument(
        "--server", required=True, metavar="URL", help="the backend, e.g. http://127.0.0.1:8000"
    )
    parser.add_argument(
        "--token", metavar="TOKEN", help="worker token (default: PIPESTUDIO_WORKER_TOKEN)"
    )
    parser.add_argument("--name", help="name shown in the dashboard (default: the host name)")
    parser.add_argument(
        "--state-dir",
        metavar="DIR",
        help="where the worker keeps its id and secret, so that it keeps "
        "its id when it restarts (default: PIPESTUDIO_WORKER_STATE_DIR, "
        "else $XDG_STATE_HOME/pipestudio or ~/.local/state/pipestudio)",
    )
    parser.add_argument(
        "--slots",
        type=int,
        metavar="N",
        help="ranks this worker runs at once (default: one per device)",
    )
    parser.add_argument(
        "--device",
        default="auto",
        choices=("auto", "cpu", "cuda"),
        help="devices to advertise; auto: CUDA when available, else the "
        "CPU; cuda: refused where no GPU is usable (default auto)",
    )
    parser.add_argument(
        "--advertise-host",
        metavar="ADDRESS",
        help="address peers dial for the run's store and this worker's ranks (default: "
        "--interface's address, else this machine's address on the route to the server)",
    )
    parser.add_argument(
        "--interface",
        metavar="NAME",
        default=os.environ.get("PIPESTUDIO_NETWORK_INTERFACE") or None,
        help="network interface of the ranks' gloo and NCCL connections (default: "
        "PIPESTUDIO_NETWORK_INTERFACE, else the one holding the advertised address; "
        "GLOO_SOCKET_IFNAME and NCCL_SOCKET_IFNAME, when set, win)",
    )
    parser.add_argument(
        "--allow-model",
        action="append",
        default=[],
        metavar="PATTERN",
        help="also run model factories matching PATTERN, e.g. "
        "'mypkg.models:*' (repeatable; added to "
        "PIPESTUDIO_ALLOWED_MODELS)",
    )
    parser.set_defaults(handler=_worker)

    parser = commands.add_parser(
        "hash-password",
        formatter_class=_Formatter,
        description=_HASH_HELP,
        help="print a PIPESTUDIO_USERS entry for a person",
    )
    parser.add_argument("name", help="the name to sign in with (letters, digits, _.@-)")
    parser.add_argument(
        "--role",
        choices=ROLES,
        default="editor",
        help="editor: may change things; viewer: reads only (default editor)",
    )
    parser.set_defaults(handler=_hash_password)

    parser = commands.add_parser(
        "db",
        formatter_class=_Formatter,
        description=_DB_GROUP_HELP,
        help="manage the backend's database schema",
    )
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    upgrade = actions.add_parser(
        "upgrade",
        formatter_class=_Formatter,
        description=_DB_HELP,
        help="migrate the database to the newest schema",
    )
    _database_url_option(upgrade)
    upgrade.set_defaults(handler=_db_upgrade)


def _database_url_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--database-url",
        metavar="URL",
        help="sqlite:///FILE or postgresql://USER@HOST/DB "
        "(default: PIPESTUDIO_DATABASE_URL, else .pipestudio/pipestudio.db)",
    )


def _settings(args: argparse.Namespace) -> Any:
    """The backend's settings, or ``None`` after printing why they are refused."""
    from pipestudio.backend.settings import SettingsError, load_settings

    overrides = {"database_url": args.database_url} if args.database_url else {}
    try:
        return load_settings(**overrides)
    except SettingsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return None


def _listen(host: str, port: int) -> socket.socket | None:
    """A socket bound to ``host:port`` (port 0: one the OS picks), so that the dashboard
    learns the real port before the server starts; ``None`` after printing why not."""
    if not 0 <= port <= 65535:
        print(f"error: --port must be 0..65535, got {port}", file=sys.stderr)
        return None
    listener = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listener.bind((host, port))
    except OSError as exc:
        listener.close()
        print(f"error: cannot listen on {host}:{port}: {exc.strerror or exc}", file=sys.stderr)
        return None
    return listener


def _dashboard(url: str, cookie_secure: bool) -> Any:
    """The dashboard's WSGI app talking to the backend at ``url`` for whoever signs in;
    ``None`` when the dashboard's packages are not installed (the API is then served
    alone)."""
    try:
        from pipestudio.dashboard.app import create_dashboard
    except ImportError as exc:
        print(
            f"warning: no dashboard ({exc}); install the `dashboard` extra to serve it at /",
            file=sys.stderr,
            flush=True,
        )
        return None
    return create_dashboard(url, cookie_secure=cookie_secure).server


def _serve(args: argparse.Namespace) -> int:
    import uvicorn

    from pipestudio.backend.app import create_app
    from pipestudio.backend.db import DatabaseUrlError

    settings = _settings(args)
    if settings is None:
        return 2
    if settings.api_token is None:
        settings = settings.model_copy(update={"api_token": secrets.token_urlsafe(24)})
    listener = _listen(args.host, args.port)
    if listener is None:
        return 2
    port = listener.getsockname()[1]
    local = _WILDCARDS.get(args.host, args.host)
    dashboard = _dashboard(
        f"http://{f'[{local}]' if ':' in local else local}:{port}", settings.cookie_secure
    )
    try:
        app = create_app(settings, dashboard=dashboard)
    except DatabaseUrlError as exc:
        listener.close()
        print(f"error: {exc}", file=sys.stderr)
        return 2
    shown = f"[{args.host}]" if ":" in args.host else args.host
    print(
        f"PipeStudio backend on http://{shown}:{port} (database "
        f"{app.state.context.db.dialect}; dashboard "
        f"{'at /' if dashboard is not None else 'not installed'})",
        flush=True,
    )
    if "PIPESTUDIO_API_TOKEN" not in os.environ:
        print(f"API token: {settings.api_token}", flush=True)
    if dashboard is not None:
        print(
            f"Sign in at http://{shown}:{port}/login with the API token"
            + (f" or as one of {len(settings.users)} configured user(s)" if settings.users else ""),
            flush=True,
        )
    config = uvicorn.Config(
        app, log_level="warning", ws_max_size=2**26, ws_per_message_deflate=False
    )
    settle_heap()  # torch, Dash and the app: out of every full collection's walk
    uvicorn.Server(config).run(sockets=[listener])
    return 0


def _hash_password(args: argparse.Namespace) -> int:
    import getpass

    from pipestudio.backend.users import UserEntryError, check_name, hash_password

    try:
        check_name(args.name)
    except UserEntryError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if sys.stdin.isatty():
        password = getpass.getpass(f"Password for {args.name}: ")
        if getpass.getpass("Again: ") != password:
            print("error: the two passwords differ", file=sys.stderr)
            return 2
    else:
        password = sys.stdin.readline().rstrip("\n")
    if not 8 <= len(password) <= MAX_PASSWORD_CHARS:
        print(
            f"error: the password must have 8 to {MAX_PASSWORD_CHARS} characters, not "
            f"{len(password)}",
            file=sys.stderr,
        )
        return 2
    print(f"{args.name}:{args.role}:{hash_password(password)}")
    return 0


def _db_upgrade(args: argparse.Namespace) -> int:
    from sqlalchemy.exc import SQLAlchemyError

    from pipestudio.backend.db import DatabaseUrlError, make_engine, normalize_url
    from pipestudio.backend.migrate import current_revision, upgrade

    settings = _settings(args)
    if settings is None:
        return 2
    try:
        engine = make_engine(settings.database_url)
        shown = normalize_url(settings.database_url).render_as_string(hide_password=True)
    except DatabaseUrlError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        before = current_revision(engine)
        upgrade(engine)
        after = current_revision(engine)
    except SQLAlchemyError as exc:
        reason = (str(getattr(exc, "orig", None) or exc).strip().splitlines() or ["?"])[0]
        print(f"error: cannot migrate {shown}: {reason}", file=sys.stderr)
        return 1
    finally:
        engine.dispose()
    change = "already at" if before == after else f"upgraded from {before or 'empty'} to"
    print(f"database {shown}: {change} revision {after}", flush=True)
    return 0


def _worker(args: argparse.Namespace) -> int:
    import asyncio
    import logging

    from pipestudio.allowlist import AllowListError, parse_patterns
    from pipestudio.runtime.agent.agent import Agent
    from pipestudio.runtime.agent.connection import AgentAuthError
    from pipestudio.runtime.agent.devices import DeviceError
    from pipestudio.runtime.agent.identity import default_state_dir
    from pipestudio.runtime.engine.network import InterfaceError

    token = args.token or os.environ.get("PIPESTUDIO_WORKER_TOKEN")
    if not token:
        print("error: give --token or set PIPESTUDIO_WORKER_TOKEN", file=sys.stderr)
        return 2
    if args.slots is not None and not 0 <= args.slots <= 1024:
        print(f"error: --slots must be 0..1024, got {args.slots}", file=sys.stderr)
        return 2
    try:
        allowed = parse_patterns(
            [os.environ.get("PIPESTUDIO_ALLOWED_MODELS", ""), *args.allow_model]
        )
    except AllowListError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    with contextlib.suppress(AttributeError, OSError, ValueError):  # stderr is no file
        faulthandler.register(signal.SIGUSR1, all_threads=True)  # kill -USR1: where it is
    try:
        agent = Agent(
            args.server,
            token,
            name=args.name,
            slots=args.slots,
            device=args.device,
            advertise_host=args.advertise_host,
            interface=args.interface,
            allowed_models=allowed,
            state_dir=Path(args.state_dir) if args.state_dir else default_state_dir(),
        )
    except (DeviceError, InterfaceError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(
        f"worker {agent.name}: {len(agent.devices)} device(s), {agent.slots} slot(s), "
        f"serving {args.server}, ranks reachable at {agent.host}; models: built-in"
        + (f" and {', '.join(allowed)}" if allowed else " only"),
        flush=True,
    )
    settle_heap()
    try:
        asyncio.run(agent.run())
    except AgentAuthError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 0
    return 0
