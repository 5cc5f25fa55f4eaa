"""What fabric-emu created on this machine: run records, the run lock, and the cleanup that removes exactly that."""
