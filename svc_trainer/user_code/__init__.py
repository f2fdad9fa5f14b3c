"""A user's code on the trainer: importing it (``imports``), fetching a
shipped package (``packages``), running a training loop of the user's
(``loop``) and turning what it did wrong into a failure a user can act on
(``failures``)."""
