"""``aistack demo`` (``make demo``): the whole stack, end to end, as a user
would drive it: through Kafka, the tuner's gRPC API, the Open Inference
Protocol and Redis, with the public client and the shared readers, never a
service's insides. ``run`` is the entry point; ``kfold`` the honest comparison
of configurations on the trainers' folds."""
