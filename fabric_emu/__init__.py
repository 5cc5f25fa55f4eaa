"""fabric-emu: an emulator for RoCEv2 AI-cluster fabrics (Mininet + Open vSwitch + os-ken)."""

__version__ = "0.1.0"
