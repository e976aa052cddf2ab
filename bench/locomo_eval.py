"""``python -m bench.locomo_eval PATH`` (``make eval EVAL_ARGS=...``): evaluate epistream on a LoCoMo-format file.

1. Streams the file's conversations through Kafka (`memory.turns`) into the running
   stack under a tenant of its own, waits until every turn is stored and, with
   `--wait-enrichment`, until every segment is enriched or failed.
2. Asks the sampled questions through `memory.questions` (a reply topic per run),
   several in flight, and scores the answers: token F1, BLEU-1, abstention, tokens,
   latency.
3. Answers the same questions with two baselines on the same master endpoint:
   the whole conversation in the window, and the k nearest turns by embedding.
4. Writes JSON and a PNG chart, prints a markdown summary, and forgets the tenant
   (unless `--keep`).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import time
import uuid
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
from aiokafka import TopicPartition

from epistream.client.sources import LocomoQA, LocomoSample, load_locomo
from epistream.contracts.questions import Mode, Question
from epistream.contracts.replies import Answer
from epistream.messaging.kafka_io import create_consumer
from epistream.messaging.topics import create_topic, delete_topics
from epistream.ops.readiness import WaitTimeout
from epistream.settings.processes import Settings
from epistream.testing.datasets import locomo_dev

from . import eval_report
from .eval_metrics import ADVERSARIAL, recall_at_k, sample_by_category, score_answer
from .ingest import wait_for_rows
from .stack import stale_worker_sources, up
from .store_state import StoreState, store_state, wait_for_enrichment
from .worker_metrics import model_requests, request_delta

log = logging.getLogger("bench.locomo_eval")

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = ROOT / "bench" / "results" / "locomo_eval.json"
INGEST_STALL_S = 300.0
ENRICH_POLL_S = 10.0


# --- arguments ------------------------------------------------------------------


def _int_list(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from exc
    if not values:
        raise argparse.ArgumentTypeError("expected at least one integer")
    return values


def add_arguments(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The evaluation's options."""
    p.add_argument("path", nargs="?", type=Path, default=locomo_dev(), help="a LoCoMo-format JSON file (list of samples "
                   "with conversation and qa; default: $LOCOMO_DEV, else the shared development split)")
    p.add_argument("--conversations", type=int, help="only the first N conversations of the file")
    p.add_argument("--categories", type=_int_list, default=[1, 2, 3, 4, 5],
                   help="question categories to ask, e.g. 1,2,3,4,5 (LoCoMo numbering)")
    p.add_argument("--limit-per-category", type=int, help="ask at most N questions of each category (random sample)")
    p.add_argument("--sample-seed", type=int, default=0, help="seed of the per-category sample")
    p.add_argument("--mode", default="deep", choices=[m.value for m in Mode], help="answer mode asked for")
    p.add_argument("--concurrency", type=int, default=2, help="questions in flight at once")
    p.add_argument("--timeout", type=float, default=900.0,
                   help="seconds to wait for one answer after sending its question")
    p.add_argument("--wait-enrichment", action="store_true",
                   help="wait until every turn is in a segment and every segment is enriched or failed")
    p.add_argument("--enrichment-timeout", type=float, default=7200.0,
                   help="give up waiting for enrichment after this many seconds (the run goes on)")
    p.add_argument("--baseline-k", type=int, default=10, help="turns the dense top-k baseline reads")
    p.add_argument("--no-baselines", action="store_true", help="skip the full-context and dense top-k baselines")
    p.add_argument("--baseline-timeout", type=float, default=600.0,
                   help="HTTP timeout of one baseline model call (a full window on a CPU model is slow)")
    p.add_argument("--no-questions", action="store_true", help="only ingest (and, with --wait-enrichment, enrich)")
    p.add_argument("--tenant", help="tenant to ingest under (default: a fresh eval-<run id>)")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="JSON results; the PNG goes beside it")
    p.add_argument("--keep", action="store_true", help="keep the run's tenant data and reply topic")
    p.add_argument("--no-up", action="store_true", help="do not start the stack (use the running one as is)")
    return p


def parse_args(argv: list[str] | None, *, prog: str = "python -m bench.locomo_eval") -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=prog, description="Evaluate epistream on a LoCoMo-format file: answers "
                                     "through Kafka, router recall, full-context and dense top-k baselines.")
    return add_arguments(parser).parse_args(argv)


# --- the plan -----------------------------------------------------------------------


@dataclass(frozen=True)
class Item:
    """One LoCoMo question of one conversation."""

    index: int  # position among the chosen conversations' questions
    sample: LocomoSample
    qa: LocomoQA

    @property
    def category(self) -> int:
        return self.qa.category

    @property
    def gold(self) -> str | None:
        return None if self.qa.category == ADVERSARIAL else self.qa.answer


def asked_at_for(sample: LocomoSample) -> datetime:
    """A day after the conversation's last session."""
    last = max((t.ts for t in sample.turns), default=datetime.now(UTC))
    return last + timedelta(days=1)


def plan(samples: list[LocomoSample], args: argparse.Namespace) -> list[Item]:
    """The sampled questions of the chosen conversations, indexed among all their questions."""
    items = [Item(i, s, qa) for i, (s, qa) in enumerate((s, qa) for s in samples for qa in s.qa)]
    return sample_by_category(items, lambda it: it.category, categories=args.categories,
                              limit_per_category=args.limit_per_category, seed=args.sample_seed)


# --- ingest ---------------------------------------------------------------------------


async def ingest(settings: Settings, samples: list[LocomoSample]) -> int:
    from epistream.client.api import produce_raw

    records = [(t.conversation_id.encode(), t.to_bytes()) for s in samples for t in s.turns]
    return await produce_raw(settings, records)


async def await_enrichment(url: str, tenant: str, timeout_s: float, idle_close_s: float) -> tuple[bool, float]:
    """The wait until every turn is in a closed segment and no segment is pending; (done, seconds)."""
    started = time.perf_counter()
    print(f"  waiting for segments to close (the last one closes {idle_close_s:.0f}s after the last turn) "
          "and be enriched", flush=True)
    last = None

    def show(state: StoreState, waited: float) -> None:
        nonlocal last
        summary = (state.segments, state.enriched, state.failed, state.open_conversations)
        if summary != last and not state.enrichment_finished():
            print(f"  [{waited:5.0f}s] segments {state.segments}: {state.enriched} enriched, {state.failed} failed, "
                  f"{state.pending} pending; {state.open_conversations} conversations with turns in no closed "
                  "segment", flush=True)
            last = summary

    try:
        state = await asyncio.to_thread(wait_for_enrichment, url, tenant, timeout_s=timeout_s,
                                        interval_s=ENRICH_POLL_S, on_poll=show)
    except WaitTimeout as exc:
        print(f"  enrichment not done after {timeout_s:.0f}s: {exc.last}; going on", flush=True)
        return False, time.perf_counter() - started
    waited = time.perf_counter() - started
    print(f"  enrichment done: {state.segments} segments ({state.failed} failed), "
          f"{state.gists} gists, {state.facts} facts ({waited:.0f}s)", flush=True)
    return True, waited


# --- asking through Kafka ---------------------------------------------------------------


class Replies:
    """Reads the run's reply topic from its start and hands each answer to whoever awaits its question id."""

    def __init__(self, settings: Settings, topic: str) -> None:
        self._consumer = create_consumer(settings, group_id=None, enable_auto_commit=False, auto_offset_reset="earliest",
                                         isolation_level="read_committed")  # answers are transactional
        self._topic = topic
        self._waiting: dict[str, asyncio.Future] = {}
        self._early: dict[str, tuple[Answer, float]] = {}
        self._task: asyncio.Task | None = None

    async def start(self) -> None:
        await self._consumer.start()
        partition = TopicPartition(self._topic, 0)
        self._consumer.assign([partition])
        await self._consumer.seek_to_beginning(partition)
        self._task = asyncio.create_task(self._read())

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        await self._consumer.stop()

    def expect(self, question_id: str) -> asyncio.Future:
        future = asyncio.get_running_loop().create_future()
        if question_id in self._early:
            future.set_result(self._early.pop(question_id))
        else:
            self._waiting[question_id] = future
        return future

    async def _read(self) -> None:
        while True:
            batches = await self._consumer.getmany(timeout_ms=500)
            for records in batches.values():
                for record in records:
                    key = (record.key or b"").decode()
                    try:
                        answer = Answer.from_bytes(record.value)
                    except ValueError:
                        log.warning("unreadable answer on %s at offset %d", self._topic, record.offset)
                        continue
                    arrived = (answer, time.perf_counter())
                    future = self._waiting.pop(key, None)
                    if future is None or future.done():  # not yet awaited, or awaited in vain (timed out)
                        self._early[key] = arrived
                    else:
                        future.set_result(arrived)

    def late(self, question_id: str) -> tuple[Answer, float] | None:
        """An answer that came after its question timed out."""
        return self._early.get(question_id)


async def ask_all(settings: Settings, items: list[Item], *, tenant: str, run_id: str, mode: Mode, reply_topic: str,
                  concurrency: int, timeout_s: float) -> dict[int, dict[str, Any]]:
    """Send every question to memory.questions, `concurrency` in flight; index -> answer record."""
    from epistream.messaging.kafka_io import create_producer

    replies = Replies(settings, reply_topic)
    await replies.start()
    producer = create_producer(settings)
    await producer.start()
    limit = asyncio.Semaphore(concurrency)
    results: dict[int, dict[str, Any]] = {}
    done = 0

    async def one(item: Item) -> None:
        nonlocal done
        question = Question(question_id=f"{run_id}-q{item.index:04d}", tenant=tenant, question=item.qa.question,
                            conversation_ids=[item.sample.conversation_id], asked_at=asked_at_for(item.sample),
                            mode=mode, reply_topic=reply_topic)
        async with limit:
            future = replies.expect(question.question_id)
            sent = time.perf_counter()
            await producer.send_and_wait(settings.topic_questions, key=question.question_id.encode(),
                                         value=question.to_bytes())
            try:
                answer, arrived = await asyncio.wait_for(future, timeout_s)
                results[item.index] = {"answer": answer, "roundtrip_s": arrived - sent}
            except TimeoutError:
                results[item.index] = {"answer": None, "roundtrip_s": None}
        if results[item.index]["answer"] is None or results[item.index]["answer"].error:
            await _stop_if_unhealthy(settings)
        done += 1
        answer = results[item.index]["answer"]
        shown = "TIMEOUT" if answer is None else f"{answer.answer[:90]!r}{' (abstained)' if answer.abstained else ''}"
        print(f"  [{done}/{len(items)}] cat {item.category} q{item.index}: {shown}", flush=True)

    try:
        await asyncio.gather(*(one(item) for item in items))
        if any(r["answer"] is None for r in results.values()):
            # Timed-out questions are still queued at the answer worker: let them finish (their answers
            # are kept as `late_answer`, unscored) so they do not compete with the baselines for the model.
            await drain(settings, timeout_s)
            for item in items:
                late = replies.late(f"{run_id}-q{item.index:04d}")
                if results[item.index]["answer"] is None and late is not None:
                    results[item.index]["late"] = late[0]
    finally:
        await producer.stop()
        await replies.stop()
    return results


async def _stop_if_unhealthy(settings: Settings) -> None:
    """A failed answer from a broken stack is no result: stop the run, naming what is broken."""
    from epistream.errors import ServiceError
    from epistream.ops.health import probe_all

    bad = [p for p in await probe_all(settings) if not p.healthy]
    if bad:
        raise ServiceError("unhealthy during the run: " + "; ".join(f"{p.service} ({p.detail})" for p in bad))


async def drain(settings: Settings, timeout_s: float) -> None:
    """Wait (at most `timeout_s`) until the answer worker has no question left on memory.questions."""
    from epistream.messaging.kafka_io import consumer_lag

    started = time.perf_counter()
    while time.perf_counter() - started < timeout_s:
        try:
            lag = (await consumer_lag(settings, settings.answer_group, [settings.topic_questions]))[settings.topic_questions]
        except Exception as exc:  # lag is advisory here
            log.warning("consumer lag unavailable: %s", exc)
            return
        if lag == 0:
            print(f"  answer worker drained ({time.perf_counter() - started:.0f}s)", flush=True)
            return
        print(f"  waiting for the answer worker to finish {lag} timed-out question(s)", flush=True)
        await asyncio.sleep(10)


def epistream_record(item: Item, got: dict[str, Any]) -> dict[str, Any]:
    answer: Answer | None = got["answer"]
    if answer is None:
        text, flag = "", True
        record: dict[str, Any] = {"answer": None, "error": "timeout", "tokens": {}, "latency_s": None,
                                  "roundtrip_s": None}
        late: Answer | None = got.get("late")
        if late is not None:  # for the record only: scored as the timeout it was
            record["late_answer"] = {"answer": late.answer, "abstained": late.abstained, "error": late.error,
                                     "latency_s": late.latency_ms / 1000}
    else:
        text, flag = answer.answer, answer.abstained
        cited = {turn for ev in answer.evidence for turn in ev.turn_ids}
        record = {
            "answer": answer.answer, "abstained_flag": answer.abstained, "mode": answer.mode.value,
            "error": answer.error, "latency_s": answer.latency_ms / 1000, "roundtrip_s": got["roundtrip_s"],
            "tokens": {role: t.model_dump() for role, t in answer.tokens.items()},
            "evidence_turn_ids": sorted(cited),
            "cited_evidence_recall": recall_at_k(item.qa.evidence, cited),
        }
    scores = score_answer(text, item.gold, item.category, abstained_flag=flag)
    record.update(f1=scores.f1, bleu1=scores.bleu1, abstained=scores.abstained)
    return record


# --- baselines ------------------------------------------------------------------------------


def _master(settings: Settings, *, timeout_s: float):  # type: ignore[no-untyped-def]
    from epistream.core.metrics import Metrics
    from epistream.ops.resources import model_client

    return model_client(settings, "master", Metrics.create(), timeout_s=timeout_s)


def baseline_record(item: Item, result) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    scores = score_answer(result.answer, item.gold, item.category, abstained_flag=result.abstained)
    usage = result.usage
    return {
        "answer": result.answer, "abstained_flag": result.abstained, "error": result.error,
        "f1": scores.f1, "bleu1": scores.bleu1, "abstained": scores.abstained, "latency_s": result.latency_s,
        "tokens": {"master": {"prompt": usage.prompt_tokens, "completion": usage.completion_tokens,
                              "calls": usage.calls}},
        "context_turns": len(result.context_turn_ids), "context_chars": result.context_chars,
        "context_evidence_recall": recall_at_k(item.qa.evidence, result.context_turn_ids),
        "cited_evidence_recall": recall_at_k(item.qa.evidence, result.cited_turn_ids),
    }


async def run_baselines(settings: Settings, pool, tenant: str, items: list[Item], vectors, *,
                        k: int, timeout_s: float) -> dict[int, dict[str, dict[str, Any]]]:  # type: ignore[no-untyped-def]
    """Every full-context answer first, then every dense one: consecutive full-context
    prompts of a conversation share their long prefix, which llama.cpp keeps cached."""
    from epistream.consumers.retrieval import DENSE_TURNS, search_turns
    from epistream.storage.db import tenant_scope

    from .eval_baselines import Line, answer_with, context_budget_chars, newest_that_fit

    master = _master(settings, timeout_s=timeout_s)
    budget = context_budget_chars(settings.model_ctx, settings.llm_max_tokens)
    full_lines: dict[str, list[Line]] = {}
    out: dict[int, dict[str, dict[str, Any]]] = {item.index: {} for item in items}
    for n, item in enumerate(items, start=1):
        conversation = item.sample.conversation_id
        if conversation not in full_lines:
            every = [Line(t.turn_id, t.speaker, t.text, t.ts) for t in item.sample.turns]
            full_lines[conversation] = newest_that_fit(every, budget)
            print(f"  full context of {item.sample.sample_id}: newest {len(full_lines[conversation])} of "
                  f"{len(every)} turns (~{budget} chars for a {settings.model_ctx}-token window)", flush=True)
        full = await answer_with(master, item.qa.question, asked_at_for(item.sample), full_lines[conversation],
                                 max_tokens=settings.llm_max_tokens, shrink_on_overflow=True)
        if full.context_turn_ids and len(full.context_turn_ids) < len(full_lines[conversation]):
            # The server counted more tokens than estimated: keep the size that fitted for the next questions.
            full_lines[conversation] = full_lines[conversation][-len(full.context_turn_ids):]
            print(f"  full context of {item.sample.sample_id} cut to the newest {len(full.context_turn_ids)} turns "
                  "(the window's real token count)", flush=True)
        out[item.index]["full_context"] = baseline_record(item, full)
        print(f"  full [{n}/{len(items)}] cat {item.category} q{item.index}: {full.answer[:80]!r} "
              f"({full.latency_s:.0f}s)", flush=True)
    for n, (item, vector) in enumerate(zip(items, vectors, strict=True), start=1):
        async with pool.connection() as conn, tenant_scope(conn, tenant):
            turns = await search_turns(conn, tenant=tenant, query=item.qa.question, vector=vector,
                                       conversation_ids=[item.sample.conversation_id],
                                       recipe=replace(DENSE_TURNS, top_k=k,
                                                      pool=max(k, settings.retrieve_pool)))
        nearest = [Line(t.turn_id, t.speaker, t.text, t.ts) for t in sorted(turns, key=lambda t: t.ts)]
        dense = await answer_with(master, item.qa.question, asked_at_for(item.sample), nearest,
                                  max_tokens=settings.llm_max_tokens)
        out[item.index]["dense_top_k"] = baseline_record(item, dense)
        print(f"  dense [{n}/{len(items)}] cat {item.category} q{item.index}: {dense.answer[:80]!r} "
              f"({dense.latency_s:.0f}s)", flush=True)
    return out


# --- the run ----------------------------------------------------------------------------------


def _stale_answer_worker(settings: Settings) -> dict[str, Any]:
    """When the answer worker started, and which answering sources changed since (it runs the older code)."""
    started, changed = stale_worker_sources(settings, ROOT, worker="answer", folders=("consumers", "epistream"))
    return {"started_at": started.isoformat(timespec="seconds") if started else None,
            "sources_changed_since": changed}


async def run(settings: Settings, args: argparse.Namespace, run_id: str, tenant: str) -> dict[str, Any]:
    from epistream.ops.resources import Resources
    from epistream.storage.db import admin_database_url

    samples = load_locomo(args.path, tenant=tenant, conversation_prefix=f"{tenant}-")
    if args.conversations is not None:
        samples = samples[: args.conversations]
    if not samples:
        raise SystemExit(f"{args.path}: no conversations to evaluate")
    asked = plan(samples, args)
    url = admin_database_url(settings)
    timings: dict[str, float] = {}
    notes: list[str] = []
    result: dict[str, Any] = {
        "run_id": run_id, "tenant": tenant, "dataset": str(Path(args.path).resolve()),
        "conversations": [s.sample_id for s in samples], "mode": args.mode, "model": settings.llm_model,
        "master_endpoint": settings.llm_base_url, "baseline_k": args.baseline_k,
        "options": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items() if k != "func"},
        "answer_worker": _stale_answer_worker(settings),
    }
    if result["answer_worker"]["sources_changed_since"]:
        notes.append("the answer worker predates changes to " + ", ".join(
            result["answer_worker"]["sources_changed_since"][:6]) + ": it answered with the older code")

    expected = len({(t.conversation_id, t.turn_id) for s in samples for t in s.turns})
    print(f"\n1. ingest: {expected} turns of {len(samples)} conversation(s) to {settings.topic_turns}, "
          f"tenant {tenant}", flush=True)
    started = time.perf_counter()
    await ingest(settings, samples)
    await asyncio.to_thread(wait_for_rows, url, tenant, expected, stall_s=INGEST_STALL_S, progress_every_s=10.0)
    print(f"  {expected}/{expected} turns stored ({time.perf_counter() - started:.1f}s)", flush=True)
    timings["ingest_s"] = round(time.perf_counter() - started, 2)
    if args.wait_enrichment:
        done, waited = await await_enrichment(url, tenant, args.enrichment_timeout, settings.segment_idle_s)
        timings["enrichment_wait_s"] = round(waited, 1)
        if not done:
            notes.append(f"enrichment was not finished after {args.enrichment_timeout:.0f}s: "
                         "summaries are missing for some segments")
    with psycopg.connect(url) as conn:
        state = store_state(conn, tenant)
    result["store"] = {"turns": state.turns, "segments": state.segments, "enriched": state.enriched,
                       "failed": state.failed, "gists": state.gists, "facts": state.facts}

    shared = await Resources.open(settings)
    pool, embedder = shared.pool, shared.embedder
    try:
        records: dict[int, dict[str, Any]] = {
            it.index: {"index": it.index, "sample_id": it.sample.sample_id,
                       "conversation_id": it.sample.conversation_id, "category": it.category,
                       "question": it.qa.question, "gold": it.gold, "adversarial_answer": it.qa.adversarial_answer,
                       "evidence": it.qa.evidence, "systems": {}}
            for it in asked
        }
        result["questions_asked"] = 0 if args.no_questions else len(asked)
        if not args.no_questions and asked:
            reply_topic = f"{settings.topic_answers}.eval-{run_id}"
            await create_topic(settings, reply_topic)
            result["reply_topic"] = reply_topic
            print(f"\n2. asking {len(asked)} questions (mode {args.mode}, {args.concurrency} in flight) "
                  f"through {settings.topic_questions}, replies on {reply_topic}", flush=True)
            started = time.perf_counter()
            requests_before = await asyncio.to_thread(model_requests, settings, "answer")
            try:
                got = await ask_all(settings, asked, tenant=tenant, run_id=run_id, mode=Mode(args.mode),
                                    reply_topic=reply_topic, concurrency=args.concurrency, timeout_s=args.timeout)
            finally:
                if not args.keep:
                    try:
                        await delete_topics(settings, [reply_topic])
                    except Exception as exc:  # cleanup only
                        log.warning("could not delete %s: %s", reply_topic, exc)
            timings["questions_s"] = round(time.perf_counter() - started, 1)
            # Whose model calls succeeded while the questions ran (other askers would count too).
            result["answer_worker_model_requests"] = request_delta(
                requests_before, await asyncio.to_thread(model_requests, settings, "answer"))
            for it in asked:
                records[it.index]["systems"]["epistream"] = epistream_record(it, got[it.index])
            result["unanswered"] = sum(1 for g in got.values() if g["answer"] is None)

            if not args.no_baselines:
                print(f"\n3. baselines on {settings.llm_base_url}: full context and dense top-{args.baseline_k}",
                      flush=True)
                started = time.perf_counter()
                asked_vectors = await asyncio.to_thread(embedder.embed, [it.qa.question for it in asked], kind="query")
                baselines = await run_baselines(settings, pool, tenant, asked, asked_vectors,
                                                k=args.baseline_k, timeout_s=args.baseline_timeout)
                timings["baselines_s"] = round(time.perf_counter() - started, 1)
                for index, systems in baselines.items():
                    records[index]["systems"].update(systems)
        result["questions"] = [records[it.index] for it in asked]
        result["systems"] = {name: eval_report.summarise_system(result["questions"], name)
                             for name in ("epistream", "full_context", "dense_top_k")}
    finally:
        if not args.keep:
            try:
                from epistream.pipeline.store.forget import forget

                async with pool.connection() as conn:
                    gone = await forget(conn, tenant)
                result["forgotten"] = gone.rows
                print(f"\nforgot tenant {tenant}: " + ", ".join(f"{n} {t}" for t, n in gone.rows.items()), flush=True)
            except Exception as exc:  # cleanup must not hide the run's own error
                log.warning("could not forget tenant %s: %s", tenant, exc)
        await shared.close()
    result["timings"] = timings
    result["notes"] = notes
    return result


def main(argv: list[str] | None = None, *, settings: Settings | None = None,
         prog: str = "python -m bench.locomo_eval") -> int:
    return run_from_args(parse_args(argv, prog=prog), settings=settings)


def run_from_args(args: argparse.Namespace, *, settings: Settings | None = None) -> int:
    """The whole evaluation from parsed arguments."""
    from epistream.errors import ServiceError
    from epistream.ops.health import probe_all

    from . import report

    settings = settings or Settings()
    logging.getLogger("httpx2").setLevel(logging.WARNING)  # one line per model request otherwise
    if args.limit_per_category is not None and args.limit_per_category < 1:
        sys.exit("--limit-per-category must be at least 1")
    if args.concurrency < 1:
        sys.exit("--concurrency must be at least 1")
    if not Path(args.path).exists():
        sys.exit(f"{args.path}: no such file")
    run_id = f"{datetime.now(UTC):%Y%m%dt%H%M%S}-{uuid.uuid4().hex[:6]}"
    tenant = args.tenant or f"eval-{run_id}"
    if not args.no_up:
        try:
            up(settings)
        except ServiceError as exc:
            sys.exit(f"bench.locomo_eval: the stack is not healthy: {exc}")
    bad = [p for p in asyncio.run(probe_all(settings)) if not p.healthy]
    if bad:
        sys.exit("bench.locomo_eval: unhealthy: " + "; ".join(f"{p.service} ({p.detail})" for p in bad))
    started = time.perf_counter()
    try:
        result = asyncio.run(run(settings, args, run_id, tenant))
    except ServiceError as exc:
        sys.exit(f"bench.locomo_eval: {exc}")
    result["timings"]["total_s"] = round(time.perf_counter() - started, 1)
    result["machine"] = report.machine_info(ROOT)
    report.write_results(Path(args.out), result, eval_report.write_chart, eval_report.markdown)
    return 0


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for noisy in ("aiokafka", "kafka", "httpx"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    sys.exit(main())
