"""What runs: model spec, builtins, backends, environment, placement, size checks."""
