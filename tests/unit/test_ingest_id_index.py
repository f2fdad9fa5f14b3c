from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from svc_ingest import id_index
from svc_ingest.id_index import IdIndex, PythonIdIndex, id_key

#: The compiled table and the Python one: every test holds both to the same answers.
TABLES = pytest.mark.parametrize("table", [IdIndex, PythonIdIndex], ids=["compiled", "python"])


def test_make_setup_built_the_compiled_table() -> None:
    # make setup builds it or stops; without it each claim costs five times as much.
    assert id_index.BUILT and IdIndex is not PythonIdIndex


def ids_at_home(slot: int, slots: int, how_many: int) -> list[bytes]:
    """Ids whose home slot in a table of ``slots`` is ``slot`` (hashes are
    keyed per process, so they are searched for, not written down)."""
    found = []
    for n in itertools.count():
        event_id = f"id-{n}".encode()
        if id_key(event_id) & (slots - 1) == slot:
            found.append(event_id)
            if len(found) == how_many:
                return found
    raise AssertionError("unreachable")


@TABLES
def test_ids_sharing_a_home_slot_across_the_end_of_the_table_survive_a_removal(table: Any) -> None:
    index = table(slots=16)
    last = ids_at_home(15, 16, 3)  # their run wraps to slots 0 and 1
    first = ids_at_home(0, 16, 2)  # homes taken by the wrapped ones: pushed on
    for ms, event_id in enumerate(last + first):
        index.claim(event_id, ms, 0)
    assert index.remove_if_seen_at(id_key(last[0]), 0)
    assert index.get(last[0]) is None
    assert [index.get(i) for i in last[1:] + first] == [1, 2, 3, 4]
    assert len(index) == 4 and index.slots == 16


@TABLES
def test_an_id_is_removed_only_at_the_time_it_is_held_at(table: Any) -> None:
    index = table()
    index.claim(b"a", 1_000, 0)
    index.claim(b"a", 3_000, 0)  # seen again after its window: a newer group holds it
    assert not index.remove_if_seen_at(id_key(b"a"), 1_000)
    assert index.get(b"a") == 3_000
    assert index.remove_if_seen_at(id_key(b"a"), 3_000) and len(index) == 0


@TABLES
def test_the_table_doubles_past_half_full_and_keeps_every_id(table: Any) -> None:
    index = table(slots=16)
    ids = [f"e{n}".encode() for n in range(12)]
    for ms, event_id in enumerate(ids):
        index.claim(event_id, ms, 0)
    assert index.slots == 32
    assert [index.get(i) for i in ids] == list(range(12))


@TABLES
def test_a_resize_wraps_the_keys_it_pushes_past_the_end(table: Any) -> None:
    index = table(slots=32)
    last = ids_at_home(63, 64, 4)  # after doubling, all want the last slot
    fillers = [i for i in (f"f{n}".encode() for n in range(100)) if i not in last][:13]
    for ms, event_id in enumerate(last + fillers):  # the 17th doubles the table
        index.claim(event_id, ms, 0)
    assert index.slots == 64
    assert [index.get(i) for i in last + fillers] == list(range(17))
    assert index.remove_if_seen_at(id_key(last[0]), 0)
    assert [index.get(i) for i in last[1:]] == [1, 2, 3]


@TABLES
def test_a_window_of_churn_keeps_the_table_its_size(table: Any) -> None:
    # The dedup window's pattern: as many ids leave as arrive.
    index = table(slots=16)
    for n in range(1000):
        index.claim(f"e{n}".encode(), n, 0)
    slots = index.slots
    for n in range(1000, 20_000):
        assert index.remove_if_seen_at(id_key(f"e{n - 1000}".encode()), n - 1000)
        index.claim(f"e{n}".encode(), n, 0)
    assert index.slots == slots and len(index) == 1000
    assert index.get(b"e19999") == 19_999 and index.get(b"e18999") is None


@TABLES
def test_a_table_size_that_is_not_a_power_of_two_is_refused(table: Any) -> None:
    with pytest.raises(ValueError, match="power of two"):
        table(slots=12)


@TABLES
def test_an_id_seen_within_the_window_is_not_claimed_again(table: Any) -> None:
    index = table()
    key = index.claim(b"a", 1_000, 500)
    assert key == id_key(b"a")
    assert index.claim(b"a", 1_500, 500) == 0  # a duplicate: its time stays
    assert index.get(b"a") == 1_000
    assert index.claim(b"a", 1_501, 500) == key and index.get(b"a") == 1_501


@TABLES
def test_an_index_of_a_rebuild_holds_each_key_at_its_latest_time(table: Any) -> None:
    ids = [f"e{n}".encode() for n in range(5000)]
    keys = np.array([id_key(i) for i in ids] + [id_key(ids[0])], dtype=np.uint64)
    times = np.array([*range(5000), 9_999], dtype=np.int64)  # e0 seen again, later
    index = table.of(keys, times)
    assert len(index) == 5000 and len(index) * 2 <= index.slots
    assert index.get(ids[0]) == 9_999
    assert [index.get(i) for i in ids[1:]] == list(range(1, 5000))
    assert index.claim(b"new", 1, 0) and len(index) == 5001


operations = st.lists(
    st.tuples(
        st.sampled_from(["claim", "remove", "remove_other_time"]),
        st.integers(0, 40).map(lambda n: f"id-{n}".encode()),
        st.integers(0, 5),
        st.integers(-1, 3),
    ),
    max_size=300,
)


@TABLES
@settings(max_examples=300, deadline=None)
@given(operations)
def test_the_index_answers_as_a_dict_would(
    table: Any, ops: list[tuple[str, bytes, int, int]]
) -> None:
    index = table(slots=4)
    model: dict[bytes, int] = {}
    for op, event_id, ms, within in ops:
        if op == "claim":
            held = model.get(event_id)
            claimed = index.claim(event_id, ms, within)
            if held is not None and ms - held <= within:
                assert claimed == 0
            else:
                assert claimed == id_key(event_id)
                model[event_id] = ms
        else:
            at = ms if op == "remove" else model.get(event_id, ms)
            removed = index.remove_if_seen_at(id_key(event_id), at)
            assert removed == (model.get(event_id) == at)
            if removed:
                del model[event_id]
        assert len(index) == len(model)
    for n in range(41):
        event_id = f"id-{n}".encode()
        assert index.get(event_id) == model.get(event_id)


def test_a_rebuild_sizes_both_tables_alike() -> None:
    ids = [f"e{n}".encode() for n in range(70_000)]
    keys = np.array([id_key(i) for i in ids] * 2, dtype=np.uint64)  # each id in two groups
    times = np.arange(len(keys), dtype=np.int64)
    compiled, python = IdIndex.of(keys, times), PythonIdIndex.of(keys, times)
    assert (len(compiled), compiled.slots) == (len(python), python.slots) == (70_000, 1 << 18)
    assert [compiled.get(i) for i in ids[::997]] == [python.get(i) for i in ids[::997]]
