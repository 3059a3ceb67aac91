"""The workspace on disk: git objects, snapshots, the lock and crash recovery."""
