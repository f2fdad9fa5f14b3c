"""Every place svc_ingest leans on Faust's (and aiokafka's, mode's) private insides.

The rest of svc_ingest uses only public names. What lives here was written
against exactly the versions in ``SUPPORTED``; importing any part of this
package under another version fails at once with one line, because each
module below reads or overrides attributes that a release may rename
without notice:

* ``batches``: bulk put/get on a stream's channel queue (asyncio's and mode's
  queue internals): ``take_batch`` and ``ack_batch``, which track and untrack
  messages in the consumer's ``WeakSet`` through its data; ``is_stale``,
  whether a batch was fetched before the last rebalance; sensors'
  per-message hooks turned off (``silence_message_hooks``).
* ``delivery``: the conductor's per-partition handler with a batch path,
  whose events make their headers' dict only when read (``RawEvent``).
* ``consumer``: the consumer's drain loop per fetched batch, the batch gate,
  the stream hold after a rebalance, highwaters that wait for a broker
  that has just come up (``recovery``), and Faust's messages made by
  aiokafka's fetcher (its ``Fetcher._records``, ``PartitionRecords``).
* ``recovery``: that wait, apart from Faust so it can be tested.
* ``changelog_idle``: table recovery's wait at the end of a transactional
  changelog, shortened (Faust's module-level ``asyncio``).
* ``lz4``: aiokafka's batch compression, LZ4 at Kafka's default (the fast
  compressor, not LZ4HC).
* ``producer``: the transactional producer of a source partition, the
  default partitioner, topic metadata; the source partitions' transactions
  committed side by side; aiokafka's batches filled through their compiled
  record builder (``BatchSlot``).
* ``tables``: a table's local store as a mapping, and the changelog offsets
  Faust's recovery starts from.
* ``transport``: the ``aistack-kafka://`` scheme that puts them together.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

from shared.errors import ConfigError

#: URL scheme of the transport (``svc_ingest.faust_compat.transport``) in Faust's registry.
SCHEME = "aistack-kafka"

#: Distribution name -> the versions this package was written and tested against.
SUPPORTED: dict[str, tuple[str, ...]] = {
    "faust-streaming": ("0.15.3",),
    "mode-streaming": ("0.7.1",),
    "aiokafka": ("0.14.0",),
}


class UnsupportedFaust(ConfigError):
    """The installed faust-streaming, mode or aiokafka is not one this package knows."""

    reason = "unsupported_dependency"


def check_versions(installed: dict[str, str | None] | None = None) -> None:
    """Raise UnsupportedFaust, naming the first distribution whose version is not
    in ``SUPPORTED``; ``installed`` (name -> version, None: absent) is for tests."""
    for name, known in SUPPORTED.items():
        found = installed.get(name) if installed is not None else _installed(name)
        if found not in known:
            raise UnsupportedFaust(
                f"svc_ingest.faust_compat supports {name} {' or '.join(known)}, "
                f"found {found or 'none'}: pin it, or review this package for the new version"
            )


def _installed(name: str) -> str | None:
    try:
        return version(name)
    except PackageNotFoundError:
        return None


check_versions()
