"""Small shared helpers: seeding and atomic file output."""
