from __future__ import annotations

from svc_ingest.dedup import DedupWindow, pack, unpack


def test_a_repeat_within_the_window_is_a_duplicate() -> None:
    window = DedupWindow({}, window_ms=1000)
    assert window.first_sighting(b"a", 10_000, 2, 7)
    assert not window.first_sighting(b"a", 10_100, 2, 8)  # still pending: same batch
    window.take_sightings()
    assert not window.first_sighting(b"a", 10_500, 2, 9)
    assert not window.first_sighting(b"a", 11_000, 2, 10)


def test_a_batch_of_one_partition_is_one_store_entry() -> None:
    store: dict[bytes, bytes] = {}
    window = DedupWindow(store, 1000)
    window.first_sighting(b"a", 1, 0, 40)
    window.first_sighting(b"b", 2, 0, 41)
    window.first_sighting(b"c", 2, 1, 7)
    assert store == {}  # nothing until the outputs are sent
    groups = window.take_sightings()
    assert {g.key: g.partition for g in groups} == {b"0/40": 0, b"1/7": 1}
    assert list(unpack(store[b"0/40"])) == [(b"a", 1), (b"b", 2)]
    assert window.take_sightings() == []


def test_a_failed_batch_leaves_no_trace() -> None:
    store: dict[bytes, bytes] = {}
    window = DedupWindow(store, 1000)
    window.first_sighting(b"a", 1, 0, 0)
    window.discard_pending()
    assert window.take_sightings() == [] and store == {}
    assert window.first_sighting(b"a", 2, 0, 0)


def test_a_repeat_after_the_window_counts_again() -> None:
    window = DedupWindow({}, window_ms=1000)
    assert window.first_sighting(b"a", 10_000, 0, 0)
    window.take_sightings()
    assert window.first_sighting(b"a", 11_001, 0, 1)


def test_expiry_forgets_old_groups_and_reports_their_partition() -> None:
    store: dict[bytes, bytes] = {}
    window = DedupWindow(store, 1000)
    window.first_sighting(b"old", 1_000, 1, 5)
    window.take_sightings()
    window.first_sighting(b"new", 5_000, 2, 9)
    window.take_sightings()
    assert window.expire(5_500) == [(b"1/5", 1)]
    assert set(store) == {b"2/9"}
    assert window.first_sighting(b"old", 5_600, 1, 6)
    assert not window.first_sighting(b"new", 5_600, 2, 10)


def test_a_re_marked_id_survives_the_expiry_of_its_older_group() -> None:
    window = DedupWindow({}, 1000)
    window.first_sighting(b"a", 1_000, 0, 0)
    window.take_sightings()
    window.first_sighting(b"a", 3_000, 0, 1)  # after the window: counted again
    window.take_sightings()
    assert window.expire(3_500) == [(b"0/0", 0)]
    assert not window.first_sighting(b"a", 3_600, 0, 2)


def test_rebuild_restores_the_index_from_the_store() -> None:
    store: dict[bytes, bytes] = {}
    first = DedupWindow(store, 1000)
    first.first_sighting(b"a", 1_000, 0, 0)
    first.take_sightings()
    first.first_sighting(b"b", 2_000, 1, 0)
    first.take_sightings()
    restored = DedupWindow(dict(store), 1000)  # a restart: the store, no index
    assert restored.first_sighting(b"b", 2_100, 1, 1)  # unknown before the rebuild
    restored.discard_pending()
    assert restored.rebuild() == 2
    assert not restored.first_sighting(b"b", 2_600, 1, 1)
    assert restored.expire(2_500) == [(b"0/0", 0)]


def test_pack_round_trips() -> None:
    entries = [(b"", 0), (b"x" * 300, 2**63), ("é".encode(), 12)]
    assert list(unpack(pack(entries))) == entries


def test_a_failed_batch_forgets_a_repeat_it_had_taken_after_the_window() -> None:
    window = DedupWindow({}, window_ms=1000)
    assert window.first_sighting(b"a", 1_000, 0, 0)
    window.take_sightings()
    assert window.first_sighting(b"a", 5_000, 0, 1)  # past the window: new again
    window.discard_pending()
    assert window.first_sighting(b"a", 5_100, 0, 1)  # the redelivered record
    assert [g.entries for g in window.take_sightings()] == [[(b"a", 5_100)]]
    assert not window.first_sighting(b"a", 5_200, 0, 2)
