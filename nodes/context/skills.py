"""The `skills` sections: the skills the run can load, and the instructions of those loaded.

Before a skill is loaded only its name and description are shown (a line each), so a large
library costs little; once loaded, its instructions sit in `loaded_skills` for the rest of
the run, with their own token budget, and survive summaries of old turns.
"""

from __future__ import annotations

from nodes.context.sections import ORDER_SKILLS, SectionItems, SectionRequest, SectionSpec
from nodes.state_tools import loaded_skills
from skills.tools import skill_options

SKILLS_HEADING = (
    "<skills>\nSkills: written methods for kinds of tasks. When one fits the task, load it "
    "with load_skill(name) before you start."
)
LOADED_HEADING = "<loaded_skills>\nSkills you loaded; follow their instructions."
DEFAULT_SKILLS_BUDGET = 600
DEFAULT_LOADED_BUDGET = 6_000


async def skills_section(request: SectionRequest) -> list[str]:
    """List the skills the run may load: name and description (loaded ones marked)."""
    library = skill_options(request.options).get("library")
    if library is None:
        return []
    loaded = loaded_skills(request.state)
    found = await library.available()
    return SectionItems(
        [
            f"- {e.skill.name}: {e.skill.description}"
            + (" (loaded)" if e.skill.name in loaded else "")
            for e in found
        ],
        [{"name": e.skill.name, "version": e.version, "owner": e.owner} for e in found],
    )


async def loaded_skills_section(request: SectionRequest) -> list[str]:
    """The instructions of every skill the run loaded, at the version it pinned."""
    loaded = loaded_skills(request.state)
    items, details = [], []
    for name, record in loaded.items():
        text = f'<skill name="{name}" version="{record["label"]}">\n{record["instructions"]}'
        if record.get("resources"):
            files = ", ".join(record["resources"])
            text += f"\n\nFiles of this skill (read_skill_resource): {files}"
        items.append(text + "\n</skill>")
        details.append({"name": name, "version": record["version"], "hash": record["hash"]})
    return SectionItems(items, details)


SKILLS_SECTION = SectionSpec(
    "skills",
    skills_section,
    ORDER_SKILLS,
    50,
    budget=DEFAULT_SKILLS_BUDGET,
    frame=(SKILLS_HEADING, "</skills>"),
)
LOADED_SKILLS_SECTION = SectionSpec(
    "loaded_skills",
    loaded_skills_section,
    ORDER_SKILLS + 1,
    80,
    budget=DEFAULT_LOADED_BUDGET,
    frame=(LOADED_HEADING, "</loaded_skills>"),
)
