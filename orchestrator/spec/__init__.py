"""What the user asked: the validated sweep spec, its config file, the machine catalog."""
