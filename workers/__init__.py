"""Process entry points: thin wiring of configuration to the packages that hold the logic."""
