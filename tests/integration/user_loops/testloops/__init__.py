"""Training loops of a user's, for the tests: shipped with their studies as
a user's project is (``--code``)."""
