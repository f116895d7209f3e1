"""Small shared helpers: seeding, atomic file output, train/eval modes, the registry."""
