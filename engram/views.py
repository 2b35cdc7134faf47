"""Rich renderings of what the client returns, for the CLI."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from engram.results import Snapshot


def print_snapshot(console: Console, snap: Snapshot) -> None:
    """Working memory, episodes, facts, persona and skills of one snapshot, as tables."""
    where = f" as of {snap.as_of.isoformat()}" if snap.as_of else ""
    console.print(
        f"[bold]{snap.agent_id}[/]{where}: seq {snap.position.seq}, "
        f"memories L2 {snap.memories.get('L2', 0)} / L3 {snap.memories.get('L3', 0)}"
    )
    working = Table("session", "task", "turns", "latest", title="working memory")
    for session in snap.working:
        turns = session.get("turns", [])
        latest = turns[-1]["content"] if turns else ""
        working.add_row(session["session_id"], session.get("task") or "", str(len(turns)), latest)
    console.print(working)
    episodes = Table("ended", "importance", "summary", title="episodes")
    for episode in snap.episodes:
        episodes.add_row(
            str(episode.get("ended_at", "")),
            f"{episode.get('importance', 0):.1f}",
            str(episode.get("summary", "")),
        )
    console.print(episodes)
    facts = Table("namespace", "key", "value", "since", title="facts")
    for fact in snap.facts:
        facts.add_row(fact["namespace"], fact["key"], fact["value"], fact["valid_from"])
    console.print(facts)
    if snap.persona:
        console.print(f"persona v{snap.persona.get('version')}: {snap.persona.get('name') or ''}")
    skills = Table("skill", "uses", "success rate", title="skills")
    for skill in snap.skills:
        rate = skill.get("success_rate")
        skills.add_row(skill["name"], str(skill["uses"]), "" if rate is None else f"{rate:.0%}")
    console.print(skills)
