"""A real FTP server (pyftpdlib) on a free localhost port: an artifact store
that is not local disk, reached over the network through fsspec's FTP
filesystem by every process that has its URL."""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator
from pathlib import Path

from pyftpdlib.authorizers import DummyAuthorizer
from pyftpdlib.handlers import FTPHandler
from pyftpdlib.servers import FTPServer


@contextlib.contextmanager
def ftp_store(root: Path) -> Iterator[str]:
    """Serve ``root`` over FTP; yields the store's URL (with its credentials)."""
    root.mkdir(parents=True, exist_ok=True)
    # pyftpdlib logs a line per command unless its logger is already set up.
    quiet = logging.getLogger("pyftpdlib")
    if not quiet.handlers:
        quiet.addHandler(logging.NullHandler())
    quiet.setLevel(logging.WARNING)
    authorizer = DummyAuthorizer()
    authorizer.add_user("aistack", "secret", str(root), perm="elradfmwMT")
    handler = type("Handler", (FTPHandler,), {"authorizer": authorizer, "banner": "aistack"})
    server = FTPServer(("127.0.0.1", 0), handler)
    port = server.socket.getsockname()[1]
    thread = threading.Thread(
        target=server.serve_forever, kwargs={"timeout": 0.2, "blocking": True}, daemon=True
    )
    thread.start()
    try:
        yield f"ftp://aistack:secret@127.0.0.1:{port}/store"
    finally:
        server.close_all()
        thread.join(timeout=10)
