"""The classroom lab: one fabric kept up while students run workloads and turn knobs, at Mininet's prompt."""
