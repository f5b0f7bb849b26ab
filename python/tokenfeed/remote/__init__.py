"""Object storage: URLs, the store a remote dataset reads through, the node cache's place and sizes."""
