"""The `skills` sections: the skills the run can load, and the instructions of those loaded.

Before a skill is loaded only its name and the first sentence of its description are shown
(a line each, the closest to the message first), so a large library costs little; once
loaded, its instructions sit in `loaded_skills` for the rest of the run, with their own
token budget, and survive summaries of old turns.
"""

from __future__ import annotations

import re

from nodes.context.sections import ORDER_SKILLS, SectionItems, SectionRequest, SectionSpec
from nodes.skill_select import last_user_text, query_vector, similarity
from nodes.state_tools import loaded_skills
from skills.tools import skill_options

SKILLS_HEADING = (
    "<skills>\nSkills: written methods for kinds of tasks. When one fits the task, load it "
    "with load_skill(name) before you start."
)
LOADED_HEADING = "<loaded_skills>\nSkills you loaded; follow their instructions."
DEFAULT_SKILLS_BUDGET = 2_000
MAX_LINE = 160
_SENTENCE = re.compile(r"(?<=[.!?])\s")
DEFAULT_LOADED_BUDGET = 6_000


def short(description: str) -> str:
    """Return a description's first sentence, at most `MAX_LINE` characters."""
    first = _SENTENCE.split(description.strip(), maxsplit=1)[0]
    return first if len(first) <= MAX_LINE else first[: MAX_LINE - 3].rstrip() + "..."


async def skills_section(request: SectionRequest) -> list[str]:
    """List the skills the run may load, those closest to the user's message first.

    Each is one line: its name and the first sentence of its description (loaded ones
    marked). When the budget cannot hold them all, the least similar are left out.
    """
    library = skill_options(request.options).get("library")
    if library is None:
        return []
    loaded = loaded_skills(request.state)
    query = query_vector(last_user_text(request.messages))
    ranked = sorted(
        ((similarity(query, s), s) for s in await library.available()),
        key=lambda pair: (-pair[0], pair[1].name),
    )
    return SectionItems(
        [
            f"- {s.name}: {short(s.description)}" + (" (loaded)" if s.name in loaded else "")
            for _, s in ranked
        ],
        [
            {"name": s.name, "version": s.version, "owner": s.owner, "similarity": round(x, 4)}
            for x, s in ranked
        ],
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
