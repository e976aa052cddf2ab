"""`agentic` answering (REMem-I): the master runs a bounded loop of tool calls
over the memory (semantic and lexical retrieval, gist and entity contexts with
time ranges, ordering and aggregation, assistant reads of a segment) and ends it
with `output_answer`. Tool calls are JSON validated against each tool's schema;
a bad call comes back to the model as an error to correct, never executed."""

from __future__ import annotations

import json
import logging
import time
from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from epistream.contracts import Answer, Evidence, Mode, Question
from epistream.db import tenant_scope
from epistream.llm import Usage

from .assistants import SegmentText, SegmentTurnText
from .prompts import load_prompt
from .tools import (
    SPECS_BY_NAME,
    TOOL_SPECS,
    OutputAnswerArgs,
    ToolArgumentError,
    call_tool,
    openai_tools,
    validate_arguments,
)

log = logging.getLogger(__name__)

AGENT_PROMPT_VERSION = "agent_v1"
ToolName = Literal[tuple(SPECS_BY_NAME)]  # type: ignore[valid-type]
OBSERVATION_CHARS = 3000


class AgentStep(BaseModel):
    """One reply of the agent: the tool to call and its arguments (validated separately, per tool)."""

    model_config = ConfigDict(extra="ignore")

    tool: ToolName  # type: ignore[valid-type]
    arguments: dict[str, Any] = Field(default_factory=dict)


def system_prompt() -> str:
    tools = "\n".join(
        f"- {spec['name']}: {spec['description']} Arguments: "
        + json.dumps({k: v.get("type", "any") for k, v in spec["parameters"].get("properties", {}).items()})
        for spec in TOOL_SPECS
    )
    return load_prompt(AGENT_PROMPT_VERSION) + "\n" + tools


def collect_evidence(observation: Any, seen: dict[str, Evidence]) -> None:
    """Remember every gist, fact and turn a tool returned, by id, as citable evidence."""
    if isinstance(observation, list):
        for item in observation:
            collect_evidence(item, seen)
        return
    if not isinstance(observation, dict):
        return
    conversation = observation.get("conversation_id")
    if conversation and "fact_id" in observation and observation.get("said_at"):
        quote = f"{observation.get('subject')} {observation.get('predicate')} {observation.get('object')}"
        seen[observation["fact_id"]] = Evidence(
            conversation_id=conversation, segment_id=observation.get("segment_id"),
            turn_ids=list(observation.get("turn_ids") or []), quote=quote, time=observation["said_at"])
    elif conversation and "gist_id" in observation and observation.get("said_at"):
        seen[observation["gist_id"]] = Evidence(
            conversation_id=conversation, segment_id=observation.get("segment_id"),
            turn_ids=list(observation.get("turn_ids") or []), quote=observation.get("text", ""),
            time=observation["said_at"])
    elif conversation and "turn_id" in observation and observation.get("ts") and observation.get("text"):
        seen.setdefault(observation["turn_id"], Evidence(
            conversation_id=conversation, segment_id=observation.get("segment_id"),
            turn_ids=[observation["turn_id"]], quote=observation["text"], time=observation["ts"],
            speaker=observation.get("speaker")))
    for value in observation.values():
        if isinstance(value, (dict, list)):
            collect_evidence(value, seen)


async def _assistant_read(deps, question: Question, result: dict[str, Any]) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    """`read_segment` is an assistant read: quotes for this question, not the whole text."""
    segment = result.get("segment") or {}
    turns = [
        SegmentTurnText(t["turn_id"], t["speaker"], t["text"], datetime.fromisoformat(t["ts"]))
        for t in segment.get("turns", [])
    ]
    if not turns:
        return result  # not found: the model reads the error
    reading = await deps.assistants.read(
        SegmentText(segment["segment_id"], segment["conversation_id"], turns), question.question)
    return {
        "segment_id": segment["segment_id"], "summary": segment.get("summary"),
        "quotes": [{"turn_id": q.turn_id, "speaker": q.speaker, "text": q.quote, "ts": q.time.isoformat(),
                    "conversation_id": q.conversation_id, "segment_id": q.segment_id} for q in reading.quotes],
        "_usage": reading.usage,
    }


async def next_step(deps, messages: list[dict[str, str]]) -> tuple[AgentStep, Usage]:  # type: ignore[no-untyped-def]
    """The agent's next tool call: through the tools API where the endpoint has one, else as JSON."""
    if deps.settings.llm_tools_api:
        name, arguments, usage = await deps.master.complete_tool_call(
            messages, openai_tools(), max_tokens=deps.settings.llm_max_tokens)
        try:
            parsed = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError:
            parsed = {"_unparsed": arguments[:200]}  # reported back to the model by validation
        if name not in SPECS_BY_NAME:
            name = "output_answer"  # an unknown function ends the loop as an abstention
            parsed = {"answer": "", "abstain": True}
        return AgentStep(tool=name, arguments=parsed if isinstance(parsed, dict) else {}), usage
    step = await deps.master.complete_json(messages, AgentStep, max_tokens=deps.settings.llm_max_tokens)
    return step.value, step.usage


async def answer_agentic(question: Question, deps) -> Answer:  # type: ignore[no-untyped-def]
    from .answer import _ms, _tokens  # shared answer helpers

    started = time.perf_counter()
    asked = question.asked_at or datetime.now(UTC)
    messages = [
        {"role": "system", "content": system_prompt()},
        {"role": "user", "content": f"Today is {asked:%Y-%m-%d}. Question: {question.question}"},
    ]
    master, assistants = Usage(), Usage()
    seen: dict[str, Evidence] = {}
    final: OutputAnswerArgs | None = None
    for _ in range(deps.settings.agentic_max_steps):
        call, usage = await next_step(deps, messages)
        master = master + usage
        messages.append({"role": "assistant", "content": call.model_dump_json()})
        try:
            if call.tool == "output_answer":
                final = validate_arguments(call.tool, call.arguments)  # type: ignore[assignment]
                break
            async with deps.pool.connection() as conn, tenant_scope(conn, question.tenant):
                result = await call_tool(conn, call.tool, call.arguments, tenant=question.tenant,
                                         embedder=deps.embedder, conversation_ids=question.conversation_ids,
                                         asked_at=asked)
            if call.tool == "read_segment":
                result = await _assistant_read(deps, question, result)
                assistants = assistants + result.pop("_usage", Usage())
            collect_evidence(result, seen)
            observation = json.dumps(result, default=str)[:OBSERVATION_CHARS]
        except ToolArgumentError as exc:
            observation = json.dumps({"error": str(exc)})
        messages.append({"role": "user", "content": f"Result of {call.tool}: {observation}"})
    if final is None:
        # Out of steps: answer from what was gathered, or abstain.
        messages.append({"role": "user", "content": "No more tool calls: call output_answer now."})
        call, usage = await next_step(deps, messages)
        master = master + usage
        try:
            final = validate_arguments("output_answer", call.arguments)  # type: ignore[assignment]
        except ToolArgumentError:
            final = OutputAnswerArgs(answer="I don't know", abstain=True)
    assert isinstance(final, OutputAnswerArgs)
    evidence = [] if final.abstain else [seen[i] for i in dict.fromkeys(final.evidence) if i in seen]
    if not final.abstain and not evidence:
        # Cited nothing it saw: keep the answer, show what it was drawn from.
        evidence = list(seen.values())[:3]
    abstained = final.abstain or not seen
    return Answer(
        question_id=question.question_id, tenant=question.tenant,
        answer=final.answer if not abstained else "I don't know: nothing in this memory supports an answer.",
        abstained=abstained, evidence=[] if abstained else evidence, mode=Mode.AGENTIC, latency_ms=_ms(started),
        tokens=_tokens(master, assistants),
    )
