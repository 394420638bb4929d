"""Errors of agent profiles, each with the HTTP status and code the API answers with."""

from __future__ import annotations


class AgentError(Exception):
    """A request about agent profiles that cannot be served as asked."""

    status = 400
    code = "agent_error"


class AgentNotFoundError(AgentError):
    """No such profile (or version) for the caller's tenant."""

    status = 404
    code = "agent_not_found"

    def __init__(self, name: str, version: int | None = None) -> None:
        what = f"agent {name!r}" if version is None else f"version {version} of agent {name!r}"
        super().__init__(
            f"{what} does not exist for your tenant; `GET /api/agents` (or `agentrt agents "
            "list`) lists the agents you can use"
        )


class UnknownAgentError(AgentError):
    """A message or conversation names a profile the tenant does not have."""

    status = 422
    code = "unknown_agent"


class AgentExistsError(AgentError):
    """Creating a profile whose name is taken."""

    status = 409
    code = "agent_exists"

    def __init__(self, name: str) -> None:
        super().__init__(
            f"agent {name!r} already exists; update it with PUT /api/agents/{name} (a new "
            "version) or pick another name"
        )


class AgentReadOnlyError(AgentError):
    """Changing a profile that is declared in a file (it lives in version control)."""

    status = 409
    code = "agent_read_only"


class AgentForbiddenError(AgentError):
    """Changing profiles needs the tenant's admin role."""

    status = 403
    code = "forbidden"
