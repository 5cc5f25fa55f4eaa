"""Packet formats on the wire: RoCEv2 headers, templates and ICRC. Pure."""
