"""The operator's access commands: tenants' keys and Kafka logins, and a secured broker's files."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from epistream.settings.processes import load_settings


def cmd_tenant_key(args: argparse.Namespace) -> int:
    from epistream.core.claims import ClaimCheck, ClaimRejected

    try:
        key = ClaimCheck.from_settings(load_settings()).key(args.tenant)
    except ClaimRejected as exc:
        print(exc, file=sys.stderr)
        return 2
    print(key.hex())
    return 0


def cmd_tenant(args: argparse.Namespace) -> int:
    from epistream.ops.tenants import TenantAdminError, add_tenant, authenticates, remove_tenant

    settings = load_settings()
    try:
        if args.action == "add":
            creds = add_tenant(settings, args.tenant)
            if not authenticates(settings):
                print(f"warning: the broker is reached over {settings.kafka_security_protocol}, which authenticates "
                      "no one: the tenant has its reply topic and key, but no login of its own, and anyone who "
                      "reaches the broker can read every topic (docs/operations.md, trust model)", file=sys.stderr)
            print(f"# tenant {args.tenant!r}: give these to its backend only", *creds.as_environment(settings),
                  sep="\n")
        else:
            creds = remove_tenant(settings, args.tenant, keep_replies=args.keep_replies)
            print(f"revoked {creds.username}: its ACLs and login are gone"
                  + ("" if args.keep_replies else f", and {creds.reply_topic} and {creds.events_topic}"))
    except TenantAdminError as exc:
        print(exc, file=sys.stderr)
        return 2
    return 0


def cmd_kafka_config(args: argparse.Namespace) -> int:
    from epistream.errors import ServiceError
    from epistream.infra.kafka_broker import write_broker_config

    settings = load_settings()
    host, _, port = (args.advertise or settings.kafka_bootstrap.split(",")[0]).rpartition(":")
    try:
        written = write_broker_config(settings, Path(args.directory), advertised_host=host, port=int(port),
                                      log_dirs=Path(args.log_dirs), owner=args.owner)
    except ServiceError as exc:
        print(exc, file=sys.stderr)
        return 2
    print("\n".join(str(path) for path in written))
    return 0


def add_access_commands(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("tenant-key", help="the key a tenant's backend signs its turns and questions with "
                                          "(derived from EPISTREAM_TENANT_KEY_SECRET; give it to that tenant only)")
    p.add_argument("tenant")
    p.set_defaults(func=cmd_tenant_key)

    p = sub.add_parser("tenant", help="on a SASL broker: give a tenant's backend its own login, ACLs (write turns "
                                      "and questions, read its replies only), reply topic and key; or revoke them")
    p.add_argument("action", choices=["add", "remove"])
    p.add_argument("tenant")
    p.add_argument("--keep-replies", action="store_true", help="remove: keep the tenant's reply and events topics")
    p.set_defaults(func=cmd_tenant)

    p = sub.add_parser("kafka-config", help="write a secured (SASL_SSL) broker's server.properties, CA, certificate "
                                            "and client.properties into DIRECTORY, for Kafka's own image")
    p.add_argument("directory")
    p.add_argument("--advertise", help="host:port the clients dial (default: EPISTREAM_KAFKA_BOOTSTRAP)")
    p.add_argument("--log-dirs", default="/var/lib/kafka/data", help="the broker's data directory, in its image")
    p.add_argument("--owner", type=int, help="uid the broker runs as: its private files are given to it")
    p.set_defaults(func=cmd_kafka_config)
