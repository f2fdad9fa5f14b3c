"""A user's project on aistack: a PyTorch model, the same as a Keras model,
and a training loop of its own, all on a table this project writes."""
