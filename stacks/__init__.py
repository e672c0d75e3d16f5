"""cdktf stacks: one per provisioning model (spot, ondemand, flex)."""
