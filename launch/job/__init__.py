"""What the user asks for: playbooks (job specs), inventories of hosts, stack outputs. Pure: parsing and validation only."""
