"""Skills: what a library of 3 to 500 skills costs each model call, in tokens and time.

Skills are stored as a tenant's uploads (plus the repository's three) in Postgres; each
model call lists the run's skills (`PostgresSkillLibrary.available`, one query) and builds
the `skills` section from names and descriptions, counted with tiktoken (o200k). The
`loaded_skills` section is measured for the shipped `research-brief`.
"""

from __future__ import annotations

import random
import time
from datetime import UTC, datetime
from pathlib import Path

from langchain_core.messages import HumanMessage

from bench.common import Figures, run_async, stat_line
from nodes.context.sections import SectionRequest
from nodes.context.skills import DEFAULT_SKILLS_BUDGET, loaded_skills_section, skills_section
from nodes.context.tokens import counter_for
from server.db.pool import migrate, open_pool
from server.settings import Settings
from server.skills.library import PostgresSkillLibrary
from server.skills.store import add_version, sync_repository
from skills.format import REPOSITORY_SKILLS, parse_skill
from skills.tools import loaded_record

TENANT = "bench"
SIZES = (3, 100, 500)
VERBS = ["Summarise", "Review", "Draft", "Check", "Plan", "Translate", "Classify", "Audit"]
OBJECTS = ["contracts", "invoices", "support tickets", "release notes", "survey answers", "logs"]


def synthetic(index: int, rng: random.Random) -> str:
    """A SKILL.md with a realistic description (about 30 words) and a short body."""
    verb, thing = rng.choice(VERBS), rng.choice(OBJECTS)
    return (
        f"---\nname: skill-{index:03d}\ndescription: {verb} {thing} for the finance and "
        f"operations teams, flagging anything unusual and listing what needs a decision. Use "
        f"when someone shares {thing} and asks for a {verb.lower()} or a second opinion.\n"
        f"version: 1.0.{index}\n---\n# {verb} {thing}\n\n1. Read everything.\n2. Report.\n"
    )


def request(library: PostgresSkillLibrary | None, state: dict[str, object]) -> SectionRequest:
    """The section request of one model call."""
    return SectionRequest(
        messages=[HumanMessage("go")],
        run_id="run_bench",
        conversation_id="c",
        tenant_id=TENANT,
        user_id="u",
        instructions="",
        now=datetime.now(UTC),
        options={"skills": {"library": library}},
        state=state,
    )


async def measure(settings: Settings, rounds: int) -> list[str]:
    """Seed the skills and time the `skills` section per model call at each library size."""
    lines: list[str] = []
    counter = counter_for("gpt-4o-mini")
    rng = random.Random(7)
    async with open_pool(settings.database_url or "", settings) as pool:
        await migrate(pool)
        await sync_repository(pool, REPOSITORY_SKILLS)
        stored = 3
        for size in SIZES:
            async with pool.connection() as conn:
                while stored < size:
                    await add_version(
                        conn, TENANT, parse_skill(synthetic(stored, rng)), "upload", "b"
                    )
                    stored += 1
            library = PostgresSkillLibrary(pool, TENANT, ["*"])
            timings = []
            for _ in range(rounds):
                began = time.perf_counter()
                items = await skills_section(request(library, {}))
                timings.append(time.perf_counter() - began)
            tokens = sum(counter.count(i) for i in items)
            fits = DEFAULT_SKILLS_BUDGET * size // max(tokens, 1)
            lines.append(
                f"- {size} skills: `skills` section {tokens:,} tokens ({tokens / size:.0f} per "
                f"skill; within the default budget of {DEFAULT_SKILLS_BUDGET:,} about "
                f"{min(fits, size)} are listed, the closest to the message first); listing "
                f"and building it per model call: {stat_line(timings)}"
            )
        brief = await PostgresSkillLibrary(pool, TENANT, ["*"]).get("research-brief")
        state = {
            "run_id": "run_bench",
            "skills": {
                "runId": "run_bench",
                "loaded": {"research-brief": loaded_record(brief, "tool")},
            },
        }
        (text,) = await loaded_skills_section(request(None, state))
        lines.append(
            f"- `loaded_skills` with `research-brief` loaded: {counter.count(text):,} tokens "
            "(default budget 6,000)"
        )
    return lines


def main(database_url: str, quick: bool) -> Figures:
    """Measure the per-call cost of the skills sections at 3, 100 and 500 skills."""
    figures = Figures("Skills", "python -m bench.run --only skills (bench/skills.py)")
    settings = Settings(_env_file=None, DATABASE_URL=database_url, data_dir=Path("/tmp"))  # type: ignore[call-arg]
    for line in run_async(measure(settings, 50 if quick else 200)):
        figures.add(line)
    return figures
