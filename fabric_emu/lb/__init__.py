"""Load balancing outside the controller: packet spraying's per-packet entropy, and the running fabric's load-balancing state as its controller reports it."""
