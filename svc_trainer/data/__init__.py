"""What trials train on: the datasets by name (``datasets``), their options,
the offline store's windows (``features``), a user's table (``tables``),
MNIST's IDX files (``idx``)."""
