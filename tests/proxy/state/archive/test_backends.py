"""Every archive backend keeps folded turns per session and credential and finds the best first."""

from __future__ import annotations

import asyncio

from proxy.state.archive import Scope
from tests.proxy.state.archive.conftest import Clock, MakeArchive, entry

ALICE = Scope("agent-1", "aa" * 16)
MALLORY = Scope("agent-1", "bb" * 16)
OTHER_SESSION = Scope("agent-2", "aa" * 16)


async def test_a_search_finds_the_best_turns_first_with_their_index_and_kind(
    make_archive: MakeArchive,
) -> None:
    archive = make_archive()
    await archive.open()
    await archive.add(
        ALICE,
        [
            entry(3, "the build failed with error E1234 in parser.py"),
            entry(4, "pytest output: error E1234 again, parser.py line 88, parser broken", kind="tool_output"),
            entry(5, "nothing to see here"),
        ],
    )  # fmt: skip
    found = await archive.search("agent-1", "parser E1234 error", tenant=ALICE.tenant, limit=10)
    assert [item.index for item in found][:2] == [4, 3] or [item.index for item in found][:2] == [
        3,
        4,
    ]
    assert {item.index for item in found} == {3, 4}
    by_index = {item.index: item for item in found}
    assert by_index[4].kind == "tool_output" and by_index[3].kind == "message"
    assert "parser.py line 88" in by_index[4].text and by_index[4].body is not None
    assert found[0].score >= found[1].score
    only = await archive.search("agent-1", "E1234", tenant=ALICE.tenant, limit=1)
    assert len(only) == 1


async def test_a_turn_that_matches_every_word_ranks_above_one_that_matches_one(
    make_archive: MakeArchive,
) -> None:
    archive = make_archive()
    await archive.open()
    filler = [entry(i, f"routine message number {i} about deployment") for i in range(10, 40)]
    await archive.add(ALICE, [*filler, entry(50, "the canary word is zebra-lighthouse")])
    found = await archive.search("agent-1", "canary zebra lighthouse", tenant=None, limit=3)
    assert found[0].index == 50


async def test_nothing_of_one_credential_or_session_is_found_from_another(
    make_archive: MakeArchive,
) -> None:
    archive = make_archive()
    await archive.open()
    await archive.add(ALICE, [entry(1, "alice secret AZURE42", compaction_id="ca")])
    await archive.add(MALLORY, [entry(1, "mallory note CRIMSON7", compaction_id="cm")])
    await archive.add(
        OTHER_SESSION, [entry(1, "other session AZURE42 ORANGE9", compaction_id="co")]
    )

    assert await archive.search("agent-1", "AZURE42", tenant=MALLORY.tenant, limit=10) == []
    assert await archive.search("agent-1", "CRIMSON7", tenant=ALICE.tenant, limit=10) == []
    assert await archive.search("agent-1", "ORANGE9", tenant=ALICE.tenant, limit=10) == []
    assert await archive.search("agent-1", "ORANGE9", tenant=None, limit=10) == []
    mine = await archive.search("agent-1", "AZURE42", tenant=ALICE.tenant, limit=10)
    assert [item.text for item in mine] == ["alice secret AZURE42"]
    # The operator's view: every credential's turns of the session, and only that session.
    both = await archive.search("agent-1", "AZURE42 CRIMSON7", tenant=None, limit=10)
    assert sorted(item.text for item in both) == ["alice secret AZURE42", "mallory note CRIMSON7"]
    assert await archive.compactions("agent-1", tenant=ALICE.tenant) == {"ca"}
    assert await archive.compactions("agent-1", tenant=None) == {"ca", "cm"}


async def test_a_turn_archived_twice_is_kept_once(make_archive: MakeArchive) -> None:
    archive = make_archive()
    await archive.open()
    await archive.add(ALICE, [entry(1, "once upon a time"), entry(2, "a time again")])
    await archive.add(ALICE, [entry(2, "a time again"), entry(3, "time flies")])
    found = await archive.search("agent-1", "time", tenant=ALICE.tenant, limit=10)
    assert sorted(item.index for item in found if item.index is not None) == [1, 2, 3]


async def test_the_same_turns_archived_twice_at_once_weigh_once(make_archive: MakeArchive) -> None:
    # Two replicas archiving one conversation's fold at once: counted twice, the turns would
    # weigh past the bound and push themselves out.
    one = make_archive().weight(entry(0, "turn0 " + "x" * 94))
    archive = make_archive(max_bytes=one * 4 + one // 2)
    await archive.open()
    turns = [entry(i, f"turn{i} " + "x" * 94) for i in range(4)]
    for dropped in await asyncio.gather(archive.add(ALICE, turns), archive.add(ALICE, turns)):
        assert dropped["size"] == 0
    found = await archive.search("agent-1", "turn0 turn1 turn2 turn3", tenant=None, limit=10)
    assert sorted(item.index for item in found if item.index is not None) == [0, 1, 2, 3]
    # One more turn is one over the bound: the oldest one goes, the others stay.
    assert (await archive.add(ALICE, [entry(4, "turn4 " + "x" * 94)]))["size"] == 1


async def test_beyond_the_size_bound_the_oldest_turns_are_dropped_and_counted(
    make_archive: MakeArchive,
) -> None:
    one = make_archive().weight(entry(0, "turn0 " + "x" * 94))
    # Five turns and a half: a turn's compressed JSON may weigh a byte more or less than another.
    archive = make_archive(max_bytes=one * 5 + one // 2)
    await archive.open()
    dropped = await archive.add(ALICE, [entry(i, f"turn{i} " + "x" * 94) for i in range(4)])
    assert dropped["size"] == 0
    dropped = await archive.add(ALICE, [entry(i, f"turn{i} " + "x" * 94) for i in range(4, 8)])
    assert dropped["size"] == 3
    found = await archive.search(
        "agent-1", " ".join(f"turn{i}" for i in range(8)), tenant=None, limit=20
    )
    assert sorted(item.index for item in found if item.index is not None) == [3, 4, 5, 6, 7]


async def test_beyond_the_total_bound_the_least_recently_archived_scope_goes_whole(
    make_archive: MakeArchive, clock: Clock
) -> None:
    one = make_archive().weight(entry(0, "turn0 " + "x" * 94))
    archive = make_archive(max_total_bytes=one * 6 + one // 2)
    await archive.open()
    first, second = Scope("agent-1", "aa" * 16), Scope("agent-2", "aa" * 16)
    turns = [entry(i, f"turn{i} " + "x" * 94) for i in range(4)]
    query = " ".join(f"turn{i}" for i in range(8))

    async def kept(scope: Scope) -> list[int]:
        found = await archive.search(scope.session, query, tenant=scope.tenant, limit=20)
        return sorted(item.index for item in found if item.index is not None)

    assert (await archive.add(first, turns))["total"] == 0
    clock.now += 1
    assert (await archive.add(second, turns))["total"] == 4  # first, whole
    assert await kept(first) == [] and await archive.compactions("agent-1", tenant=None) == set()
    assert await kept(second) == [0, 1, 2, 3]
    clock.now += 1
    # The only scope left, over the bound on its own: its oldest turns go.
    more = [entry(i, f"turn{i} " + "x" * 94) for i in range(4, 8)]
    assert (await archive.add(second, more))["total"] == 2
    assert await kept(second) == [2, 3, 4, 5, 6, 7]


async def test_turns_older_than_the_age_bound_are_dropped_and_counted(
    make_archive: MakeArchive, clock: Clock
) -> None:
    archive = make_archive(max_age_s=100)
    await archive.open()
    await archive.add(ALICE, [entry(1, "ancient history", at=clock.now)])
    clock.now += 150
    dropped = await archive.add(ALICE, [entry(2, "recent history", at=clock.now)])
    assert dropped["age"] == 1
    found = await archive.search("agent-1", "history", tenant=None, limit=10)
    assert [item.index for item in found] == [2]


async def test_a_query_without_words_finds_nothing(make_archive: MakeArchive) -> None:
    archive = make_archive()
    await archive.open()
    await archive.add(ALICE, [entry(1, "something")])
    assert await archive.search("agent-1", " -- !! ", tenant=None, limit=10) == []
    assert await archive.search("agent-1", 'quote " AND OR NEAR(', tenant=None, limit=10) == []


async def test_when_no_turn_holds_every_word_the_one_holding_most_ranks_first(
    make_archive: MakeArchive,
) -> None:
    archive = make_archive()
    await archive.open()
    await archive.add(
        ALICE,
        [
            entry(1, "the budget cap is 500 dollars"),
            entry(2, "a budget meeting"),
            entry(3, "rules for exceeding"),
            entry(4, "another budget note"),
        ],
    )
    found = await archive.search("agent-1", "budget cap exceeding rule", tenant=None, limit=2)
    assert found[0].index == 1 and found[0].score > found[1].score


async def test_find_gives_the_search_and_the_credentials_compactions_at_once(
    make_archive: MakeArchive,
) -> None:
    archive = make_archive()
    await archive.open()
    await archive.add(ALICE, [entry(1, "alice AZURE42", compaction_id="ca")])
    await archive.add(MALLORY, [entry(1, "mallory AZURE42", compaction_id="cm")])
    found, compactions = await archive.find("agent-1", "AZURE42", tenant=ALICE.tenant, limit=5)
    assert [item.text for item in found] == ["alice AZURE42"] and compactions == {"ca"}
    found, compactions = await archive.find("agent-1", "AZURE42", tenant=None, limit=5)
    assert len(found) == 2 and compactions is None
