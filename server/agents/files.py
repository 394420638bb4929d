"""Profiles declared in files (`agents/*.yaml`), synced into the database on start-up.

A file declares one profile: `name`, optionally `tenants` (the server's default tenant when
absent), and the profile's fields. On start-up every declared profile whose content changed
gets a new version (source `file`); the API cannot change it, so the file stays the truth.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from server.agents.profiles import AgentSpec, parse_ref
from server.agents.store import create_profile, update_profile
from server.db.pool import Pool
from server.errors import (
    AgentFileError,
    AgentNotFoundError,
    BadAgentReferenceError,
    StartupError,
)
from server.settings import Settings

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DeclaredAgent:
    """A profile read from a file."""

    name: str
    tenants: tuple[str, ...]
    spec: AgentSpec
    path: str


def _describe(exc: ValidationError) -> str:
    return "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors())


def read_agent_file(path: Path, default_tenant: str) -> DeclaredAgent:
    """Read and check one profile file.

    Raises:
        AgentFileError: unreadable YAML, no valid `name`, or an invalid profile field.
    """
    try:
        data: Any = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise AgentFileError(f"{path}: cannot be read as YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise AgentFileError(f"{path}: must be a mapping with `name` and the profile's fields")
    body = dict(data)
    name = body.pop("name", None)
    if not isinstance(name, str):
        raise AgentFileError(f"{path}: needs `name`, e.g. `name: support`")
    try:
        parsed, version = parse_ref(name)
    except BadAgentReferenceError as exc:
        raise AgentFileError(f"{path}: {exc}") from exc
    if version is not None or parsed != name:
        raise AgentFileError(f"{path}: `name` must be a plain name, not {name!r}")
    tenants = body.pop("tenants", None) or [default_tenant]
    if not isinstance(tenants, list) or not all(isinstance(t, str) for t in tenants):
        raise AgentFileError(f"{path}: `tenants` must be a list of tenant ids")
    try:
        spec = AgentSpec.model_validate(body)
    except ValidationError as exc:
        raise AgentFileError(f"{path}: invalid profile: {_describe(exc)}") from exc
    return DeclaredAgent(name, tuple(tenants), spec, str(path))


def read_agent_files(folder: Path, default_tenant: str) -> list[DeclaredAgent]:
    """Read every `*.yaml` / `*.yml` profile in `folder` (none if it does not exist).

    Raises:
        AgentFileError: a file is invalid, or two files declare the same name for a tenant.
    """
    if not folder.is_dir():
        return []
    declared: list[DeclaredAgent] = []
    seen: dict[tuple[str, str], str] = {}
    for path in sorted([*folder.glob("*.yaml"), *folder.glob("*.yml")]):
        agent = read_agent_file(path, default_tenant)
        for tenant in agent.tenants:
            other = seen.setdefault((tenant, agent.name), agent.path)
            if other != agent.path:
                raise AgentFileError(
                    f"{path} and {other} both declare agent {agent.name!r} for tenant {tenant!r}"
                )
        declared.append(agent)
    return declared


async def sync_agent_files(pool: Pool, folder: Path, default_tenant: str) -> list[str]:
    """Store a new version of every declared profile that changed; return their references.

    Raises:
        AgentFileError: a file is invalid (nothing is synced then).
    """
    changed = []
    for agent in read_agent_files(folder, default_tenant):
        for tenant in agent.tenants:
            try:
                version, new = await update_profile(
                    pool, tenant, agent.name, agent.spec, by="file", source="file", path=agent.path
                )
            except AgentNotFoundError:
                version = await create_profile(
                    pool,
                    tenant,
                    agent.name,
                    agent.spec,
                    by="file",
                    source="file",
                    path=agent.path,
                )
                new = True
            if new:
                changed.append(f"{tenant}/{agent.name}@{version.version}")
    if changed:
        log.info("agent profiles synced from %s: %s", folder, ", ".join(changed))
    return changed


async def sync_agents(pool: Pool, settings: Settings) -> None:
    """Sync `AGENTRT_AGENTS_DIR` at start-up; an invalid file stops the start in one line.

    Raises:
        StartupError: a profile file is invalid.
    """
    try:
        await sync_agent_files(pool, settings.agents_dir, settings.default_tenant)
    except AgentFileError as exc:
        raise StartupError(f"agent profile file refused: {exc}") from exc


def check_agent_files(settings: Settings) -> None:
    """Refuse to start, in one line, when a profile file is invalid (before anything starts).

    Raises:
        StartupError: a profile file is invalid.
    """
    try:
        read_agent_files(settings.agents_dir, settings.default_tenant)
    except AgentFileError as exc:
        raise StartupError(f"agent profile file refused: {exc}") from exc
