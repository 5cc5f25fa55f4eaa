"""Pure congestion-control state machines and formulas (no root, no I/O): take `now`, return actions."""
