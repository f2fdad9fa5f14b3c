"""Where trials run: a long-lived process per framework (``pool``), the
process itself (``process``), what it reports (``events``), and the memory
its processes hold (``memory``)."""
