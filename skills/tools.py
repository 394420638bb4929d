"""The skill tools: `load_skill` and `read_skill_resource`, on the run's skill library.

They reach the library through the run's section options (`skills.library`), which the
server fills for each run. The first load of a skill in a run pins its exact version (the
content hash), and every later load or resource read of that run uses the pinned version.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from langchain_core.tools import ToolException

from skills.library import LibrarySkill, SkillLibrary, SkillUnavailableError
from tools.run_state import RunStateView, current_view
from tools.spec import agent_tool

SKILL_TOOLS = ("load_skill", "read_skill_resource")
# The output a model reads of a loaded skill; the instructions go into the system prompt.
LOADED_NOTE = (
    "Skill {name} (version {label}) is loaded: its instructions are now in your system prompt "
    'under <skill name="{name}">; follow them.'
)


def skill_options(options: Mapping[str, Any]) -> Mapping[str, Any]:
    """Return the run's skill settings from its section options."""
    found = options.get("skills")
    return found if isinstance(found, Mapping) else {}


def run_library(view: RunStateView) -> SkillLibrary:
    """Return the run's skill library, or refuse when the agent has no skills."""
    library = skill_options(view.options).get("library")
    if library is None:
        raise ToolException("this agent has no skills")
    return library  # type: ignore[no-any-return]


def loaded_record(entry: LibrarySkill, via: str) -> dict[str, Any]:
    """Return what a run keeps of a loaded skill (its state, and the `skill.loaded` event)."""
    skill = entry.skill
    return {
        "name": skill.name,
        "version": entry.version,
        "label": skill.label,
        "hash": skill.content_hash,
        "owner": entry.owner,
        "description": skill.description,
        "allowedTools": None if skill.allowed_tools is None else list(skill.allowed_tools),
        "resources": sorted(skill.resources),
        "instructions": skill.instructions,
        "via": via,
    }


async def pinned_or_current(view: RunStateView, name: str) -> LibrarySkill:
    """Return the version the run pinned for `name`, else the library's current one."""
    library = run_library(view)
    pinned = view.skills.get(name)
    try:
        return await library.get(name, pinned["hash"] if pinned else None)
    except SkillUnavailableError as exc:
        raise ToolException(str(exc)) from exc


@agent_tool(idempotent=True)
async def load_skill(name: str) -> str:
    """Load a skill: a written method for a kind of task (steps, rules, output format).

    Load the skill listed under <skills> whose description fits the task before you start
    it; its instructions then appear in your system prompt, and the tools you may use may be
    narrowed to those the skill needs.

    Args:
        name: The skill's name, as listed under <skills>.
    """
    view = current_view()
    async with view.lock:
        entry = await pinned_or_current(view, name)
        record = loaded_record(entry, "tool")
        view.skills.setdefault(name, record)
    return json.dumps({"loaded": record, "note": LOADED_NOTE.format(**record)})


@agent_tool(idempotent=True)
async def read_skill_resource(skill: str, path: str) -> str:
    """Read a file that comes with a loaded skill (a template, reference text, an example).

    Args:
        skill: The loaded skill's name.
        path: The file's path, as the skill's instructions or its resource list name it.
    """
    view = current_view()
    if skill not in view.skills:
        raise ToolException(f"load the skill first: load_skill(name={skill!r})")
    entry = await pinned_or_current(view, skill)
    text = entry.skill.resources.get(path)
    if text is None:
        names = ", ".join(sorted(entry.skill.resources)) or "none"
        raise ToolException(f"skill {skill!r} has no file {path!r}; its files: {names}")
    return text
