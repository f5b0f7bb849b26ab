"""The GPU hop: the device stage that moves batches to the GPU on a side stream, and the device feeder."""
