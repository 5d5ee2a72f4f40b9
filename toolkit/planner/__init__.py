"""How fast: `toolkit bench` (a measured step per world size) and `toolkit plan` (an alpha-beta model of a step at N workers)."""
