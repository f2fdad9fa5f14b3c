from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from svc_ingest.id_index import IdIndex, id_key


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


def test_ids_sharing_a_home_slot_across_the_end_of_the_table_survive_a_removal() -> None:
    index = IdIndex(slots=16)
    last = ids_at_home(15, 16, 3)  # their run wraps to slots 0 and 1
    first = ids_at_home(0, 16, 2)  # homes taken by the wrapped ones: pushed on
    for ms, event_id in enumerate(last + first):
        index.put(event_id, ms)
    assert index.remove_if_seen_at(id_key(last[0]), 0)
    assert index.get(last[0]) is None
    assert [index.get(i) for i in last[1:] + first] == [1, 2, 3, 4]
    assert len(index) == 4 and index.slots == 16


def test_an_id_is_removed_only_at_the_time_it_is_held_at() -> None:
    index = IdIndex()
    index.put(b"a", 1_000)
    index.put(b"a", 3_000)  # seen again after its window: a newer group holds it
    assert not index.remove_if_seen_at(id_key(b"a"), 1_000)
    assert index.get(b"a") == 3_000
    assert index.remove_if_seen_at(id_key(b"a"), 3_000) and len(index) == 0


def test_the_table_doubles_past_seven_tenths_full_and_keeps_every_id() -> None:
    index = IdIndex(slots=16)
    ids = [f"e{n}".encode() for n in range(12)]
    for ms, event_id in enumerate(ids):
        index.put(event_id, ms)
    assert index.slots == 32
    assert [index.get(i) for i in ids] == list(range(12))


def test_a_resize_wraps_the_keys_it_pushes_past_the_end() -> None:
    index = IdIndex(slots=32)
    last = ids_at_home(63, 64, 4)  # after doubling, all want the last slot
    fillers = [i for i in (f"f{n}".encode() for n in range(100)) if i not in last][:13]
    for ms, event_id in enumerate(last + fillers):  # the 17th doubles the table
        index.put(event_id, ms)
    assert index.slots == 64
    assert [index.get(i) for i in last + fillers] == list(range(17))
    assert index.remove_if_seen_at(id_key(last[0]), 0)
    assert [index.get(i) for i in last[1:]] == [1, 2, 3]


def test_a_window_of_churn_keeps_the_table_its_size() -> None:
    # The dedup window's pattern: as many ids leave as arrive.
    index = IdIndex(slots=16)
    for n in range(1000):
        index.put(f"e{n}".encode(), n)
    slots = index.slots
    for n in range(1000, 20_000):
        assert index.remove_if_seen_at(id_key(f"e{n - 1000}".encode()), n - 1000)
        index.put(f"e{n}".encode(), n)
    assert index.slots == slots and len(index) == 1000
    assert index.get(b"e19999") == 19_999 and index.get(b"e18999") is None


def test_a_table_size_that_is_not_a_power_of_two_is_refused() -> None:
    with pytest.raises(ValueError, match="power of two"):
        IdIndex(slots=12)


operations = st.lists(
    st.tuples(
        st.sampled_from(["put", "remove", "remove_other_time"]),
        st.integers(0, 40).map(lambda n: f"id-{n}".encode()),
        st.integers(0, 5),
    ),
    max_size=300,
)


@settings(max_examples=300, deadline=None)
@given(operations)
def test_the_index_answers_as_a_dict_would(ops: list[tuple[str, bytes, int]]) -> None:
    index = IdIndex(slots=4)
    model: dict[bytes, int] = {}
    for op, event_id, ms in ops:
        if op == "put":
            index.put(event_id, ms)
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
