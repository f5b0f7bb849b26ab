"""The Loader: batches assembled by the C engine, its state, resume."""
