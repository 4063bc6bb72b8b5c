"""An agent run by the SDK's own Runner in a sandfork sandbox, on the SDK's scripted test
model (no model API is called): the model asks for a shell command, the sandbox runs it,
and the command's output reaches the model's next turn."""

from __future__ import annotations

import json
from typing import Any

import pytest
from agents import RunConfig, Runner
from agents.sandbox import Manifest, SandboxAgent, SandboxRunConfig
from agents.sandbox.capabilities import Shell
from agents.sandbox.entries import File
from agents.testing import ScriptedModel, assistant_message, function_call

from agents_sandfork import SandforkSandboxClient, SandforkSandboxClientOptions

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("daemon", "no_leaks")]


def tool_outputs(call: Any) -> str:
    """The function-call outputs the model was shown on a turn, as one string."""
    return json.dumps([item for item in call.input if isinstance(item, dict) and item.get("type") == "function_call_output"], default=str)


async def test_a_scripted_agent_runs_a_command_in_the_sandbox() -> None:
    model = ScriptedModel(
        [
            [function_call("exec_command", {"cmd": "cat task.txt; echo computed=$((6 * 7))"}, call_id="call-1")],
            [assistant_message("the answer is 42")],
        ]
    )
    agent = SandboxAgent(
        name="solver",
        instructions="Solve the task in the sandbox.",
        model=model,
        default_manifest=Manifest(entries={"task.txt": File(content=b"multiply six by seven\n")}),
        capabilities=[Shell()],
    )
    client = SandforkSandboxClient()
    run_config = RunConfig(
        sandbox=SandboxRunConfig(client=client, options=SandforkSandboxClientOptions(image="busybox")),
        tracing_disabled=True,
    )
    result = await Runner.run(agent, "What is six times seven?", run_config=run_config)
    assert result.final_output == "the answer is 42"
    model.assert_complete()
    shown = tool_outputs(model.calls[1])
    assert "multiply six by seven" in shown and "computed=42" in shown, shown
