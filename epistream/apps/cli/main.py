"""`epistream`: the command line, and the composition root of every process."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from epistream.apps.cli.access import add_access_commands
from epistream.apps.cli.mcp import add_mcp_command
from epistream.apps.cli.output import fail_loudly, print_answer, print_rows, unhealthy
from epistream.contracts.questions import CONTEXT_BUDGET_DEFAULT, CONTEXT_BUDGET_MAX, CONTEXT_BUDGET_MIN
from epistream.core import tracing
from epistream.errors import SettingsError
from epistream.settings.processes import ClientSettings, Settings, load_settings

if TYPE_CHECKING:
    from epistream.contracts.positions import Position


def _settings() -> Settings:
    return load_settings()


def _client_settings() -> ClientSettings:
    """The client verbs' settings (produce, ask, context, forget): a client install configures no server.
    Tracing starts here where OTEL_* asks for it, so what a verb produces carries its trace."""
    settings = load_settings(ClientSettings)
    tracing.setup("epistream-cli")  # the client's spans hold no text: EPISTREAM_TRACE_TEXTS is the workers'
    return settings


def cmd_up(args: argparse.Namespace) -> int:
    from epistream.errors import ServiceError
    from epistream.infra import services

    try:
        rows = services.up(_settings(), workers=not args.no_workers)
    except ServiceError as exc:
        print(f"epistream is not healthy: {exc}", file=sys.stderr)
        return 1
    print("epistream is up:")
    print_rows(rows)
    return 0


def cmd_down(args: argparse.Namespace) -> int:
    from epistream.infra import services

    print_rows(services.down(_settings()))
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    from epistream.infra import services

    rows = services.status(_settings())
    print_rows(rows)
    return 0 if all(r.running for r in rows) else 1


def cmd_health(args: argparse.Namespace) -> int:
    """The probes alone, without the supervisor: what container health checks run."""
    from epistream.ops.health import probe_all

    probes = asyncio.run(probe_all(_settings(), only=set(args.services) or None))
    print_rows(probes)
    return 0 if probes and all(p.healthy for p in probes) else 1


def _turn_records(path: Path, tenant: str | None, prefix: str) -> Iterator[tuple[bytes | None, bytes]]:
    """(key, value) pairs from a JSONL or LoCoMo file. JSONL lines go as they are,
    even invalid ones: the ingest agent dead-letters them with the reason."""
    from epistream.client.sources import detect_format, load_locomo, read_turns_jsonl

    if detect_format(path) == "locomo":
        for sample in load_locomo(path, tenant=tenant or "locomo", conversation_prefix=prefix):
            for turn in sample.turns:
                yield turn.conversation_id.encode(), turn.to_bytes()
        return
    for _, data, _error in read_turns_jsonl(path):
        if data is None:
            continue  # counted by the caller's pre-scan
        if tenant:
            data["tenant"] = tenant
        if prefix and isinstance(data.get("conversation_id"), str):
            data["conversation_id"] = prefix + data["conversation_id"]
        key = data.get("conversation_id")
        yield (key.encode() if isinstance(key, str) else None), json.dumps(data).encode()


def cmd_produce(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from epistream.client.api import produce_raw
    from epistream.client.sources import detect_format, read_turns_jsonl

    settings = _client_settings()
    path = Path(args.file)
    if detect_format(path) == "jsonl":
        bad = [(n, e) for n, d, e in read_turns_jsonl(path) if d is None]
        for line, error in bad:
            print(f"{path}:{line}: skipped: {error}", file=sys.stderr)
    records = list(_turn_records(path, args.tenant, args.conversation_prefix))
    positions: dict[str, Position] = {}
    with tqdm(total=len(records), unit="turn", desc=f"producing to {settings.topic_turns}") as bar:
        sent = asyncio.run(produce_raw(settings, records, progress=bar, positions=positions))
    print(f"produced {sent} turns from {path}")
    # Each conversation's last turn, as `context`/`ask` take it to read what was just produced.
    for n, position in enumerate(positions.values()):
        if n == 20:
            print(f"(and {len(positions) - 20} more conversations)")
            break
        print(f"--after {position.conversation_id}@{position.partition}:{position.offset}")
    return 0


def _after(text: str) -> Position:
    """`[CONVERSATION@]PARTITION:OFFSET`, as `epistream produce` prints it, for --after."""
    from epistream.contracts.positions import Position

    conversation, _, at = text.rpartition("@")
    partition, sep, offset = at.partition(":")
    try:
        if not sep:
            raise ValueError("no ':'")
        return Position(conversation_id=conversation or "*", partition=int(partition), offset=int(offset))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{text!r} is not [CONVERSATION@]PARTITION:OFFSET ({exc})") from None


def cmd_ask(args: argparse.Namespace) -> int:
    from epistream.client.api import ask
    from epistream.contracts.questions import Mode, Question

    settings = _client_settings()
    question = Question(
        question_id=f"q-{uuid.uuid4()}",
        tenant=args.tenant,
        question=args.question,
        conversation_ids=args.conversation or None,
        asked_at=datetime.fromisoformat(args.asked_at) if args.asked_at else datetime.now(UTC),
        mode=Mode(args.mode),
    )
    if not args.no_check:
        bad = unhealthy(settings, {"kafka", "worker-answer"})
        if bad:
            return fail_loudly(settings, "cannot ask: the answer path is not healthy", bad=bad)
    try:
        answer = asyncio.run(ask(settings, question, timeout_s=args.timeout, after=args.after))
    except TimeoutError as exc:
        return fail_loudly(settings, str(exc))
    if args.json:
        print(answer.model_dump_json(indent=2))
    else:
        print_answer(answer, question.question)
    if answer.error:
        return fail_loudly(settings, f"the answer failed: {answer.error}")
    if answer.incomplete:
        print(f"epistream ask: incomplete: {answer.incomplete}", file=sys.stderr)
    return 0


def _instant(text: str) -> datetime:
    """An ISO-8601 time for --since/--until/--asked-at; one without an offset is read as UTC."""
    value = datetime.fromisoformat(text)
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


def cmd_context(args: argparse.Namespace) -> int:
    from epistream.client.api import context
    from epistream.errors import ContractError

    settings = _client_settings()
    if not args.no_check:
        bad = unhealthy(settings, {"kafka", "worker-answer"})
        if bad:
            return fail_loudly(settings, "cannot read context: the answer path is not healthy", bad=bad)
    try:
        reply = asyncio.run(context(
            settings, tenant=args.tenant, question=args.question, budget_tokens=args.budget,
            since=_instant(args.since) if args.since else None, until=_instant(args.until) if args.until else None,
            conversation_ids=args.conversation or None,
            asked_at=_instant(args.asked_at) if args.asked_at else None, timeout_s=args.timeout, after=args.after,
        ))
    except ContractError as exc:  # a budget or range the contract refuses, said plainly
        print(f"epistream context: {exc}", file=sys.stderr)
        return 2
    except TimeoutError as exc:
        return fail_loudly(settings, str(exc))
    if reply.error:
        return fail_loudly(settings, f"the context read failed: {reply.error}")
    if args.json:
        print(reply.model_dump_json(indent=2, exclude_none=True))
    else:
        print(reply.text)
        print(f"({len(reply.items)} items, {reply.used_tokens} of {reply.budget_tokens} tokens, "
              f"{reply.latency_ms:.0f} ms)", file=sys.stderr)
    if reply.incomplete:
        print(f"epistream context: incomplete: {reply.incomplete}", file=sys.stderr)
    return 0


def cmd_sql(args: argparse.Namespace) -> int:
    from psycopg.conninfo import make_conninfo

    from epistream.infra.postgres_server import psql_binary
    from epistream.storage.db import admin_database_url, reader_url, split_password

    settings = _settings()
    if args.admin == (args.tenant is not None):
        print("give --tenant T (read-only, T's rows only) or --admin (the database owner, every row)",
              file=sys.stderr)
        return 2
    if args.admin:
        # The workers' and readers' logins load AGE themselves (sql/017); the owner's session is told to.
        url, preset = make_conninfo(admin_database_url(settings), options="-c session_preload_libraries=age"), []
    else:
        url, preset = reader_url(settings, args.tenant), ["-v", f"tenant={args.tenant}"]  # for the examples' :'tenant'
    # The password goes in psql's environment, not on its command line, where `ps` shows it to anyone.
    url, password = split_password(url)
    env = os.environ | ({"PGPASSWORD": password} if password is not None else {})
    psql = psql_binary()
    os.execve(psql, [psql, url, *preset, *args.psql_args], env)
    return 0  # not reached


def sql_arguments(argv: list[str]) -> argparse.Namespace:
    """`sql`'s own options come first (--tenant T, --tenant=T, --admin); everything after them belongs
    to psql (-v, -c, -f ...), untouched."""
    tenant, admin, rest = None, False, list(argv)
    while rest:
        if rest[0] == "--admin":
            admin, rest = True, rest[1:]
        elif rest[0] == "--tenant" and len(rest) > 1:
            tenant, rest = rest[1], rest[2:]
        elif rest[0].startswith("--tenant="):
            tenant, rest = rest[0].removeprefix("--tenant="), rest[1:]
        else:
            break
    return argparse.Namespace(command="sql", func=cmd_sql, tenant=tenant, admin=admin, psql_args=rest, verbose=False)


def cmd_worker(args: argparse.Namespace) -> int:
    settings = _settings()
    if args.name == "ingest":
        from epistream.pipeline.app import run_worker as run_ingest

        run_ingest(settings)
    elif args.name == "enrich":
        from epistream.pipeline.enrich_app import run_worker as run_enrich

        run_enrich(settings)
    else:
        from epistream.consumers.worker import run_worker as run_answer

        run_answer(settings)
    return 0


def cmd_forget(args: argparse.Namespace) -> int:
    if args.conversation is None and not args.whole_tenant:
        print("give --conversation ID, or --whole-tenant to forget everything of the tenant", file=sys.stderr)
        return 2
    try:
        from epistream.pipeline.erasure import forget_everywhere
        from epistream.pipeline.store.forget import Forgotten
    except ImportError:  # a client install: the erasure goes through Kafka, the ingest workers delete
        return _forget_through_kafka(args)

    from epistream.storage.db import open_pool

    settings = _settings()

    async def run() -> Forgotten:
        pool = await open_pool(settings)
        try:
            return await forget_everywhere(settings, pool, args.tenant, args.conversation)
        finally:
            await pool.close()

    done = asyncio.run(run())
    what = f"conversation {done.conversation_id!r}" if done.conversation_id else "every conversation"
    print(f"forgot {what} of tenant {done.tenant!r}: " + ", ".join(f"{n} {t}" for t, n in done.rows.items())
          + f", {done.graph_elements} graph elements; its record in {settings.topic_forgotten} keeps replays and "
          "rebuilds from restoring it")
    return 0


def _forget_through_kafka(args: argparse.Namespace) -> int:
    from epistream.client.api import forget

    settings = _client_settings()
    record = asyncio.run(forget(settings, tenant=args.tenant, conversation_id=args.conversation))
    what = f"conversation {record.conversation_id!r}" if record.conversation_id else "every conversation"
    print(f"recorded the erasure of {what} of tenant {record.tenant!r} in {settings.topic_forgotten}; the ingest "
          "workers delete it as they read it (with epistream[worker] installed, this command deletes at once)")
    return 0


def cmd_prometheus(args: argparse.Namespace) -> int:
    from epistream.infra import prometheus_server

    settings = _settings()
    if args.action == "down":
        print("stopped" if prometheus_server.stop(settings.state_dir / prometheus_server.NAME) else "was not running")
        return 0
    print(prometheus_server.start_for(settings, port=args.port))
    return 0


def cmd_migrate(args: argparse.Namespace) -> int:
    from epistream.storage.db import admin_database_url, apply_migrations, set_login_passwords

    settings = _settings()
    url = admin_database_url(settings)
    applied = apply_migrations(url)
    print("applied: " + (", ".join(applied) if applied else "nothing (up to date)"))
    for role in set_login_passwords(url, settings):
        print(f"set the password of {role}")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from epistream.apps.cli.demo import run_demo
    from epistream.contracts.questions import Mode

    return run_demo(_settings(), start=not args.no_start, mode=Mode(args.mode))


def _add_reply_options(p: argparse.ArgumentParser, *, timeout_s: float, reply: str) -> None:
    """What `ask` and `context` share: how long to wait, how to print, what to read after, the health check."""
    p.add_argument("--timeout", type=float, default=timeout_s)
    p.add_argument("--json", action="store_true", help=f"print {reply} as JSON")
    p.add_argument("--after", action="append", type=_after, metavar="[CONVERSATION@]PARTITION:OFFSET",
                   help="read only once these positions (as `produce` prints them) are stored (repeatable)")
    p.add_argument("--no-check", action="store_true", help="skip the health check of Kafka and the answer worker")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="epistream", description="Streaming episodic memory for LLM agents.")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("up", help="start Kafka, PostgreSQL, the model server and the workers (idempotent)")
    p.add_argument("--no-workers", action="store_true", help="start only the services")
    p.set_defaults(func=cmd_up)
    sub.add_parser("down", help="stop everything this state directory started").set_defaults(func=cmd_down)
    sub.add_parser("status", help="each service: its process (pid, restarts, last exit) and a probe that uses it"
                   ).set_defaults(func=cmd_status)
    p = sub.add_parser("health", help="run the health probes only (exit 1 if one fails): container health checks")
    p.add_argument("services", nargs="*",
                   help="kafka, postgres, model-server, embedder, worker-ingest, worker-enrich, worker-answer (default: all)")
    p.set_defaults(func=cmd_health)

    p = sub.add_parser("produce", help="stream turns from a JSONL or LoCoMo file to memory.turns")
    p.add_argument("file")
    p.add_argument("--tenant", help="override (JSONL) or set (LoCoMo, default 'locomo') the tenant")
    p.add_argument("--conversation-prefix", default="", help="prefix added to conversation ids")
    p.set_defaults(func=cmd_produce)

    p = sub.add_parser("ask", help="ask a question through memory.questions and print the answer")
    p.add_argument("question")
    p.add_argument("--tenant", default="demo")
    p.add_argument("--conversation", action="append", help="restrict to this conversation (repeatable)")
    p.add_argument("--mode", default="auto", choices=["fast", "deep", "agentic", "auto"],
                   help="how to answer (a no-model context read is `epistream context`)")
    p.add_argument("--asked-at", help="ISO-8601 time the question is asked at (default: now)")
    _add_reply_options(p, timeout_s=300.0, reply="the answer message")
    p.set_defaults(func=cmd_ask)

    p = sub.add_parser("context", help="the best memory for a question within a token budget (no model call): "
                                       "a prompt-ready text block, or the whole reply with --json")
    p.add_argument("question")
    p.add_argument("--tenant", default="demo")
    p.add_argument("--budget", type=int, default=CONTEXT_BUDGET_DEFAULT, help=f"most tokens of memory "
                   f"({CONTEXT_BUDGET_MIN}..{CONTEXT_BUDGET_MAX}; default {CONTEXT_BUDGET_DEFAULT})")
    p.add_argument("--since", help="only memory from this ISO-8601 time on")
    p.add_argument("--until", help="only memory before this ISO-8601 time")
    p.add_argument("--conversation", action="append", help="restrict to this conversation (repeatable)")
    p.add_argument("--asked-at", help="ISO-8601 time 'last week' etc. are read against (default: now)")
    _add_reply_options(p, timeout_s=30.0, reply="the MemoryContext message")
    p.set_defaults(func=cmd_context)

    p = sub.add_parser("sql", help="psql on the memory database: --tenant T reads T's rows only (epistream_reader), "
                                   "--admin is the database owner; the arguments after them go to psql")
    p.add_argument("--tenant", help="read-only, as epistream_reader, this tenant's rows only")
    p.add_argument("--admin", action="store_true", help="as the database owner (the superuser when embedded)")
    p.add_argument("psql_args", nargs=argparse.REMAINDER)
    p.set_defaults(func=cmd_sql)

    p = sub.add_parser("worker", help="run one worker in the foreground")
    p.add_argument("name", choices=["ingest", "enrich", "answer"])
    p.set_defaults(func=cmd_worker)

    p = sub.add_parser("forget", help="delete a conversation (or a whole tenant) and everything derived from it")
    p.add_argument("--tenant", required=True)
    p.add_argument("--conversation", help="the conversation to forget")
    p.add_argument("--whole-tenant", action="store_true", help="forget every conversation of the tenant")
    p.set_defaults(func=cmd_forget)

    add_mcp_command(sub)
    add_access_commands(sub)

    p = sub.add_parser("prometheus", help="a local Prometheus scraping the workers, with the alert rules")
    p.add_argument("action", choices=["up", "down"])
    p.add_argument("--port", type=int, default=19090)
    p.set_defaults(func=cmd_prometheus)

    sub.add_parser("migrate", help="apply pending SQL migrations").set_defaults(func=cmd_migrate)

    p = sub.add_parser("demo", help="start everything, stream the sample conversation, ask its questions")
    p.add_argument("--no-start", action="store_true", help="use the running stack")
    p.add_argument("--mode", default="fast", choices=["fast", "deep", "agentic", "auto"],
                   help="answering mode for the sample questions (fast: one model call each)")
    p.set_defaults(func=cmd_demo)

    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["sql"]:
        args = sql_arguments(argv[1:])
    else:
        args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    for noisy in ("aiokafka", "kafka", "httpx", "httpx2", "faust", "mode", "pgserver"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    try:
        return int(args.func(args) or 0)
    except SettingsError as exc:
        print(f"epistream: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
