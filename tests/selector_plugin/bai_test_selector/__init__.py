"""An agent selector plugin for the tests: only agents whose id starts with a prefix, the one
with the most free cpu first."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from scheduler_app.policy import (
    AgentSelector,
    AgentSelectorOptionError,
    CandidateAgent,
    PendingSession,
)


class ByPrefix(AgentSelector):
    """Options: ``prefix`` (required, a non-empty string)."""

    def __init__(self, options: Mapping[str, object]) -> None:
        unknown = sorted(set(options) - {"prefix"})
        if unknown:
            raise AgentSelectorOptionError(unknown[0], "unknown option; this selector takes prefix")
        prefix = options.get("prefix")
        if prefix is None:
            raise AgentSelectorOptionError("prefix", "required")
        if not isinstance(prefix, str) or not prefix:
            raise AgentSelectorOptionError("prefix", "must be a non-empty string")
        self.prefix = prefix

    def select(
        self, session: PendingSession, agents: Sequence[CandidateAgent], *, one_agent: bool
    ) -> Mapping[str, str] | str:
        named = [a for a in agents if a.agent_id.startswith(self.prefix)]
        if not named:
            return f"no agent named {self.prefix}* can hold it"
        best = max(named, key=lambda a: (a.free["cpu"], a.agent_id))
        if not one_agent and len(session.kernels) > 1:
            return f"spreading over {self.prefix}* agents is not supported"
        return {kernel.kernel_id: best.agent_id for kernel in session.kernels}
