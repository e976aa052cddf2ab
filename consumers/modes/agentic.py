"""`agentic` answering (REMem-I): the master runs a bounded loop of tool calls
over the memory (semantic and lexical retrieval, gist and entity contexts with
time ranges, ordering and aggregation, assistant reads of a segment) and ends it
with `output_answer`. Tool calls are JSON validated against each tool's schema;
a bad call comes back to the model as an error to correct, never executed."""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from epistream.contracts.questions import Question
from epistream.contracts.replies import Evidence, ProgressStep
from epistream.models.llm import Usage
from epistream.models.prompts import register
from epistream.storage.db import tenant_scope

from ..assistants import SegmentText, SegmentTurnText
from ..deps import AnswerDeps
from ..progress import Steps
from ..timefilter import QuestionTime
from ..tools import (
    SPECS_BY_NAME,
    TOOL_SPECS,
    AssistantReadResult,
    OutputAnswerArgs,
    SegmentResult,
    ToolArgumentError,
    ToolResult,
    openai_tools,
    run_tool,
    validate_arguments,
)
from .base import Abstention, ModeResult

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    ToolName = str  # the checker cannot read a Literal built at run time from the registry
else:
    ToolName = Literal[tuple(SPECS_BY_NAME)]
OBSERVATION_CHARS = 3000  # a tool result in the agent's context: whole items left out beyond it


class AgentStep(BaseModel):
    """One reply of the agent: the tool to call and its arguments (validated separately, per tool)."""

    model_config = ConfigDict(extra="ignore")

    tool: ToolName
    arguments: dict[str, Any] = Field(default_factory=dict)


# Registered here, not in epistream.consumers.prompts beside the others: the schema names the tools, and
# epistream.consumers.tools imports the assistants, which import epistream.consumers.prompts (a cycle otherwise).
AGENT_PROMPT = register("epistream.consumers.prompts", "agent", 1, AgentStep)


def system_prompt() -> str:
    tools = "\n".join(
        f"- {spec['name']}: {spec['description']} Arguments: "
        + json.dumps({k: v.get("type", "any") for k, v in spec["parameters"].get("properties", {}).items()})
        for spec in TOOL_SPECS
    )
    return AGENT_PROMPT.template + "\n" + tools


async def _assistant_read(deps: AnswerDeps, question: Question,
                          result: SegmentResult) -> tuple[ToolResult, Usage]:
    """`read_segment` is an assistant read: quotes for this question, not the whole text."""
    segment = result.segment
    if not segment.turns:
        return result, Usage()  # nothing to read: the model sees the segment as it is
    turns = [SegmentTurnText(t.turn_id, t.speaker, t.text, t.ts) for t in segment.turns]
    reading = await deps.assistants.read(
        SegmentText(segment.segment_id, segment.conversation_id, turns), question.question)
    return AssistantReadResult(segment.segment_id, segment.summary, list(reading.quotes)), reading.usage


async def next_step(deps: AnswerDeps, messages: list[dict[str, str]]) -> tuple[AgentStep, Usage]:
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
    step = await deps.master.complete_json(messages, AGENT_PROMPT.schema, max_tokens=deps.settings.llm_max_tokens)
    return step.value, step.usage


def _final_answer(arguments: dict[str, Any]) -> OutputAnswerArgs:
    """output_answer's arguments, validated as any tool's are (a ToolArgumentError when they fail)."""
    final = validate_arguments("output_answer", arguments)
    assert isinstance(final, OutputAnswerArgs)
    return final


async def answer_agentic(question: Question, deps: AnswerDeps, steps: Steps | None = None) -> ModeResult:
    steps = steps or Steps.none()
    asked = QuestionTime.of(question).asked_at  # the anchor every date expression of a tool call resolves against
    messages = [
        {"role": "system", "content": system_prompt()},
        {"role": "user", "content": f"Today is {asked:%Y-%m-%d}. Question: {question.question}"},
    ]
    master, assistants = Usage(), Usage()
    seen: dict[str, Evidence] = {}
    final: OutputAnswerArgs | None = None
    most = deps.settings.agentic_max_steps
    for number in range(1, most + 1):
        call, usage = await next_step(deps, messages)
        master = master + usage
        steps.report(ProgressStep.TOOL_CALL, done=number, total=most, tool=call.tool)
        messages.append({"role": "assistant", "content": call.model_dump_json()})
        try:
            if call.tool == "output_answer":
                final = _final_answer(call.arguments)
                break
            async with deps.read_pool.connection() as conn, tenant_scope(conn, question.tenant):
                result = await run_tool(conn, call.tool, call.arguments, tenant=question.tenant,
                                        embedder=deps.embedder, conversation_ids=question.conversation_ids,
                                        asked_at=asked)
            if isinstance(result, SegmentResult):
                result, read_usage = await _assistant_read(deps, question, result)
                assistants = assistants + read_usage
                steps.report(ProgressStep.ASSISTANT_READ, done=1, total=1)
            for cited, item in result.evidence().items():
                seen.setdefault(cited, item)  # citable by id; the first sighting stays
            observation = result.observation(OBSERVATION_CHARS)
        except ToolArgumentError as exc:
            observation = json.dumps({"error": str(exc)})
        messages.append({"role": "user", "content": f"Result of {call.tool}: {observation}"})
    if final is None:
        # Out of steps: answer from what was gathered, or abstain.
        messages.append({"role": "user", "content": "No more tool calls: call output_answer now."})
        steps.report(ProgressStep.MASTER_CALL)
        call, usage = await next_step(deps, messages)
        master = master + usage
        try:
            final = _final_answer(call.arguments)
        except ToolArgumentError:
            final = OutputAnswerArgs(answer=Abstention.EMPTY.value, abstain=True)
    evidence = [] if final.abstain else [seen[i] for i in dict.fromkeys(final.evidence) if i in seen]
    if not final.abstain and not evidence:
        # Cited nothing it saw: keep the answer, show what it was drawn from.
        evidence = list(seen.values())[:3]
    if final.abstain or not seen:
        return ModeResult.abstain(Abstention.NO_EVIDENCE, master=master, assistants=assistants)
    return ModeResult(final.answer, False, evidence, master, assistants)
