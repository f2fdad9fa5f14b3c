"""The ``aistack-kafka://`` transport: Faust's aiokafka one with the batch
consumer and conductor, transactions committed side by side, recovery's
short wait at a changelog's end, and Kafka's fast LZ4.
``faust.App(broker="aistack-kafka://host:9092")`` picks it once
:func:`register_scheme` has run (importing this module runs it).
"""

from __future__ import annotations

from faust.transport.drivers import TRANSPORTS
from faust.transport.drivers import aiokafka as _aiokafka

from svc_ingest.faust_compat import SCHEME, changelog_idle, lz4
from svc_ingest.faust_compat.consumer import BatchConsumer
from svc_ingest.faust_compat.delivery import BatchConductor
from svc_ingest.faust_compat.producer import Producer

__all__ = ["SCHEME", "Transport", "register_scheme"]


class Transport(_aiokafka.Transport):
    """aiokafka transport using :class:`BatchConsumer`, :class:`BatchConductor`
    and :class:`Producer`."""

    Consumer = BatchConsumer
    Conductor = BatchConductor
    Producer = Producer


def register_scheme() -> None:
    """Register ``aistack-kafka://`` in faust's transport registry (idempotent),
    shorten table recovery's wait at a changelog's end with it, and have
    aiokafka compress LZ4 with the fast compressor (``lz4``)."""
    TRANSPORTS.aliases.setdefault(SCHEME, f"{__name__}:Transport")
    changelog_idle.shorten()
    lz4.use_fast_lz4()


register_scheme()
