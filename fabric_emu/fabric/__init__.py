"""The emulated fabric up and down: Mininet hosts and Open vSwitch switches, the os-ken controller process, captures and events."""
