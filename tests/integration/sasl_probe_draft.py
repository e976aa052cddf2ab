"""DRAFT (branch kafka-sasl): the probe that showed the embedded SASL broker enforcing ACLs by hand;
to become tests/integration/test_kafka_acls.py. Needs a SASL broker on 127.0.0.1:39092 (see the commit)."""
import asyncio
from confluent_kafka.admin import (AdminClient, AclBinding, AclOperation, AclPermissionType, ResourcePatternType,
                                   ResourceType, NewTopic, UserScramCredentialUpsertion, ScramCredentialInfo, ScramMechanism)
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.errors import TopicAuthorizationFailedError, KafkaError

BOOT = "127.0.0.1:39092"
admin = AdminClient({"bootstrap.servers": BOOT, "security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "SCRAM-SHA-512",
                     "sasl.username": "epistream", "sasl.password": "workers-secret"})
for t in ("a", "b"):
    f = admin.alter_user_scram_credentials([UserScramCredentialUpsertion(f"tenant-{t}", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 8192), f"pw-{t}".encode())])
    for k, v in f.items(): v.result()
    fs = admin.create_topics([NewTopic(f"memory.answers.tenant-{t}", 1, 1)])
    for k, v in fs.items():
        try: v.result()
        except Exception as e: print("topic", e)
    acls = [AclBinding(ResourceType.TOPIC, "memory.turns", ResourcePatternType.LITERAL, f"User:tenant-{t}", "*", AclOperation.WRITE, AclPermissionType.ALLOW),
            AclBinding(ResourceType.TOPIC, f"memory.answers.tenant-{t}", ResourcePatternType.PREFIXED, f"User:tenant-{t}", "*", AclOperation.READ, AclPermissionType.ALLOW)]
    for k, v in admin.create_acls(acls).items(): v.result()
print("users and acls made")

async def as_tenant(t, pw, topic):
    c = AIOKafkaConsumer(bootstrap_servers=BOOT, security_protocol="SASL_PLAINTEXT", sasl_mechanism="SCRAM-SHA-512",
                         sasl_plain_username=f"tenant-{t}", sasl_plain_password=pw, group_id=None, enable_auto_commit=False)
    await c.start()
    try:
        tp = TopicPartition(topic, 0); c.assign([tp]); await c.seek_to_beginning(tp)
        r = await c.getmany(tp, timeout_ms=3000)
        return f"read ok ({sum(len(v) for v in r.values())} records)"
    except KafkaError as e:
        return f"refused: {type(e).__name__}"
    finally:
        await c.stop()

async def produce_as(t, pw, topic):
    p = AIOKafkaProducer(bootstrap_servers=BOOT, security_protocol="SASL_PLAINTEXT", sasl_mechanism="SCRAM-SHA-512",
                         sasl_plain_username=f"tenant-{t}", sasl_plain_password=pw)
    try:
        await p.start()
        await p.send_and_wait(topic, b"x")
        return "produce ok"
    except KafkaError as e:
        return f"refused: {type(e).__name__}"
    finally:
        await p.stop()

async def main():
    print("A reads A's replies:", await as_tenant("a", "pw-a", "memory.answers.tenant-a"))
    print("A reads B's replies:", await as_tenant("a", "pw-a", "memory.answers.tenant-b"))
    print("A reads memory.answers:", await as_tenant("a", "pw-a", "memory.answers"))
    print("A reads memory.turns:", await as_tenant("a", "pw-a", "memory.turns"))
    print("A writes memory.turns:", await produce_as("a", "pw-a", "memory.turns"))
    print("A writes memory.dlq:", await produce_as("a", "pw-a", "memory.dlq"))
    try:
        print("wrong password:", await as_tenant("a", "nope", "memory.answers.tenant-a"))
    except Exception as e:
        print("wrong password: refused", type(e).__name__)
asyncio.run(main())

async def check2():
    p = AIOKafkaProducer(bootstrap_servers=BOOT, security_protocol="SASL_PLAINTEXT", sasl_mechanism="SCRAM-SHA-512",
                         sasl_plain_username="epistream", sasl_plain_password="workers-secret")
    await p.start(); await p.send_and_wait("memory.answers.tenant-b", b"B's answer"); await p.stop()
    print("B reads B's replies:", await as_tenant("b", "pw-b", "memory.answers.tenant-b"))
    print("A reads B's replies:", await as_tenant("a", "pw-a", "memory.answers.tenant-b"))
asyncio.run(check2())
