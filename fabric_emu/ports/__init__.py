"""Switch and NIC ports: traffic classes, ECN marking, buffer accounting and PFC (kernel side)."""
